"""Audits: `encoderkit scan <engine> ...` prints a verdict or summary and writes <engine>.json, <engine>.md and
PNGs to --out."""
from __future__ import annotations

import click

from .options import (
    documents_option,
    dtype_option,
    mask_rate_option,
    max_length_option,
    model_dir_argument,
    out_option,
    seed_option,
)


@click.group()
def scan() -> None:
    """Audit a model or its inputs: provenance, membership, backdoors, OOD, shift, consistency."""


@scan.command("provenance")
@model_dir_argument
@click.option("--manifest", "manifest", default=None,
              help="manifest to verify against (or to write); default MODEL_DIR/encoderkit-manifest.json when present")
@click.option("--write-manifest", is_flag=True,
              help="record the directory's SHA-256 manifest now (instead of verifying one)")
@out_option("directory for provenance.json and provenance.md (default: print the verdict only)", required=False)
@click.option("--strict", is_flag=True, hidden=True,
              help="exit with code 1 unless the verdict is trusted (always so now; kept for old scripts)")
def scan_provenance(model_dir: str, manifest: str | None, write_manifest: bool, out_dir: str | None,
                    strict: bool) -> int:
    """Audit MODEL_DIR without loading it: manifest hashes, safetensors headers, pickle imports, config vs weights.

    Prints the verdict and its reasons; exits with code 1 unless the verdict is trusted."""
    from ..security.provenance import ModelProvenanceChecker

    report = ModelProvenanceChecker(model_dir).check(manifest, write_manifest=write_manifest)
    first = f": {report.reasons[0]}" if report.reasons else ""
    more = f" (+{len(report.reasons) - 1} more)" if len(report.reasons) > 1 else ""
    where = f"; report in {report.write(out_dir)['markdown']}" if out_dir else ""
    click.echo(f"{report.verdict}{first}{more}{where}")
    for reason in report.reasons[1:]:
        click.echo(f"  {reason}")
    return 0 if report.trusted else 1


@scan.command("consistency")
@model_dir_argument
@click.argument("texts_file")
@out_option("directory for consistency.json, consistency.md and the PNG")
@click.option("--edits", default=",".join(("case", "whitespace", "punctuation", "name", "typo")), show_default=True,
              help="comma-separated meaning-preserving edits to try")
@seed_option(help="seed of the edits' random choices")
@click.option("--typos", type=int, default=1, show_default=True, help="typos put into each text by the typo edit")
@click.option("--text-field", default=None, help="text column/key of a .tsv/.csv/.jsonl TEXTS_FILE")
@dtype_option(help=None, choices=("fp32", "bf16"))
def scan_consistency(model_dir: str, texts_file: str, out_dir: str, edits: str, seed: int, typos: int,
                     text_field: str | None, dtype: str) -> None:
    """Check that MODEL_DIR's predictions survive meaning-preserving edits of the texts in TEXTS_FILE."""
    from ..security.consistency import BehaviorConsistencyValidator, parse_edits, read_texts

    names = parse_edits(edits)  # a typo in --edits fails before the model loads
    texts = read_texts(texts_file, text_field)
    validator = BehaviorConsistencyValidator.from_pretrained(model_dir, dtype=dtype, typos=typos)
    report = validator.validate(texts, names, seed=seed, model_name=model_dir)
    paths = report.write(out_dir)
    rates = ", ".join(f"{e.edit} {'n/a' if e.consistency_rate is None else f'{100 * e.consistency_rate:.1f}%'}"
                      for e in report.edits)
    click.echo(f"{len(texts)} texts; consistency: {rates}; {report.failures} failing case(s); "
               f"report in {paths['markdown']}")


@scan.command("attack")
@model_dir_argument
@click.argument("texts_file")
@out_option("directory for attack.json and attack.md")
@click.option("--method", type=click.Choice(["substitute", "insert"]), default="substitute", show_default=True,
              help="greedy substitution by embedding neighbours, or greedy insertion of neighbour words")
@click.option("--budget", type=int, default=500, show_default=True, help="classifier queries allowed per text")
@click.option("--max-rate", type=float, default=0.25, show_default=True,
              help="most words an attack may change, as a share of the text's words")
@click.option("--neighbours", type=int, default=20, show_default=True, help="embedding neighbours tried per word")
@click.option("--insert-words", default="", help="extra comma-separated words to try inserting (--method insert)")
@dtype_option()
def scan_attack(model_dir: str, texts_file: str, out_dir: str, method: str, budget: int, max_rate: float,
                neighbours: int, insert_words: str, dtype: str) -> None:
    """Attack the classifier in MODEL_DIR on TEXTS_FILE (TSV lines `text<TAB>label`; optional header)."""
    from ..security.attacks import WordAttack, read_labelled_texts
    from ..tasks.classify import Classifier

    texts, labels = read_labelled_texts(texts_file)
    attack = WordAttack(Classifier.from_pretrained(model_dir, dtype=dtype), method=method, query_budget=budget,
                        max_perturbed_rate=max_rate, neighbours=neighbours,
                        insert_candidates=[w.strip() for w in insert_words.split(",") if w.strip()])
    result = attack.attack(texts, labels)
    paths = result.write(out_dir)
    click.echo(f"attack success rate {result.success_rate:.3f} ({result.successes} of {result.attacked} correctly "
               f"classified texts), mean perturbed-word rate {result.mean_perturbed_rate:.3f}, mean queries "
               f"{result.mean_queries:.1f}; report in {paths['markdown']}")


@scan.command("shift")
@model_dir_argument
@out_option("directory for shift.json, shift.md and shift_histogram.png")
@click.option("--original", "original_path", help="pair mode: original texts, one per line")
@click.option("--modified", "modified_path", help="pair mode: modified texts, one per line, aligned with --original")
@click.option("--texts", "texts_path", help="single-text mode: texts to score, one per line (needs --reference)")
@click.option("--reference", "reference_path", help="single-text mode: training-distribution texts, one per line")
@click.option("--calibrate", "calibrate_path",
              help="benign data for the threshold: TSV lines `original<TAB>modified` (pair mode) or one text per "
                   "line (single-text mode)")
@click.option("--fpr", type=float, default=0.05, show_default=True, help="target false-positive rate of the threshold")
@click.option("--representation", type=click.Choice(["cls", "mean", "pooled", "logits", "probabilities", "embedding"]),
              default="cls", show_default=True, help="what the shift is measured on")
@click.option("--top-k", type=int, default=5, show_default=True, help="most responsible words per text (0: none)")
@click.option("--neighbours", type=int, default=10, show_default=True,
              help="single-text mode: reference neighbours each score averages over")
@dtype_option()
def scan_shift(model_dir: str, out_dir: str, original_path: str | None, modified_path: str | None,
               texts_path: str | None, reference_path: str | None, calibrate_path: str | None, fpr: float,
               representation: str, top_k: int, neighbours: int, dtype: str) -> None:
    """Embedding shift of modified texts vs their originals (pair mode) or of texts vs reference texts."""
    from ..errors import InputError
    from ..security.shift import EmbeddingShiftDetector, read_lines, read_pairs
    from ..tasks.classify import Classifier

    pair_mode = original_path is not None or modified_path is not None
    if pair_mode == (texts_path is not None or reference_path is not None):
        raise InputError("give either --original and --modified (pair mode) or --texts and --reference "
                         "(single-text mode)")
    if pair_mode and not (original_path and modified_path):
        raise InputError("pair mode needs both --original and --modified")
    if not pair_mode and not (texts_path and reference_path):
        raise InputError("single-text mode needs both --texts and --reference")
    if top_k < 0:
        raise InputError(f"--top-k must be 0 or more, found {top_k}")
    detector = EmbeddingShiftDetector(Classifier.from_pretrained(model_dir, dtype=dtype),
                                      representation=representation, neighbours=neighbours)
    if pair_mode:
        originals, modifieds = read_lines(original_path, "--original"), read_lines(modified_path, "--modified")
        if len(originals) != len(modifieds):
            raise InputError(f"--original has {len(originals)} texts but --modified has {len(modifieds)}; "
                             "give one modified text per original, line by line")
        if calibrate_path:
            detector.calibrate(*read_pairs(calibrate_path), false_positive_rate=fpr)
        report = detector.compare(originals, modifieds, top_k=top_k)
    else:
        detector.fit_reference(read_lines(reference_path, "--reference"))
        if calibrate_path:
            detector.calibrate_single(read_lines(calibrate_path, "--calibrate"), false_positive_rate=fpr)
        report = detector.score(read_lines(texts_path, "--texts"), top_k=top_k)
    paths = report.write(out_dir)
    flagged = (f"{report.flagged} of {report.count} flagged above {report.threshold:.4g}" if report.calibration
               else f"{report.count} scored (no --calibrate: nothing flagged)")
    click.echo(f"{report.mode} shift ({representation}): mean {report.mean_score:.4f}; {flagged}; "
               f"report in {paths['markdown']}")


@scan.command("backdoor")
@model_dir_argument
@click.argument("texts_file")
@out_option("directory for backdoor.json, backdoor.md and the PNG")
@click.option("--top-k", type=int, default=10, show_default=True,
              help="single words per target class verified on the clean texts (after the vocabulary screen)")
@click.option("--threshold", type=float, default=None,
              help="flip rate from which the model is called backdoored [default: 0.9, fixed a priori]")
@click.option("--verify-texts", type=int, default=200, show_default=True,
              help="clean texts per target class each candidate is inserted into")
@seed_option(help="seed of the text sampling and positions")
@dtype_option("auto")
def scan_backdoor(model_dir: str, texts_file: str, out_dir: str, top_k: int, threshold: float | None,
                  verify_texts: int, seed: int, dtype: str) -> int:
    """Search the classifier in MODEL_DIR for trigger words that force a class, using clean TEXTS_FILE
    (one text per line, or a .tsv/.csv/.jsonl with a text column)."""
    from ..security.backdoor import DEFAULT_THRESHOLD, BackdoorTriggerScanner, read_texts

    texts = read_texts(texts_file)  # a missing file fails before the model loads
    scanner = BackdoorTriggerScanner.from_pretrained(
        model_dir, dtype=dtype, top_k=top_k, verify_texts=verify_texts, seed=seed,
        threshold=DEFAULT_THRESHOLD if threshold is None else threshold)
    report = scanner.scan(texts)
    paths = report.write(out_dir)
    best = report.candidates[0]
    click.echo(f"{report.verdict}: score {report.score:.3f} (threshold {report.threshold:g}); best candidate "
               f"{best.text!r} -> {best.target} flips {best.flipped} of {best.trials} texts; report in "
               f"{paths['markdown']}")
    return 0


@scan.command("confidence")
@model_dir_argument
@click.option("--texts", "texts_path", required=True,
              help="in-distribution texts: one per line, or CSV/TSV (header with text and optional label) or JSONL")
@click.option("--labels", "labels_path", help="gold labels, one per line in the order of --texts (enables ECE)")
@click.option("--fit", "fit_path", help="training texts for the Mahalanobis scores (same formats; labels used "
              "when present, else predictions), or the mahalanobis_fit.npz of an earlier run")
@click.option("--ood", "ood_path", help="out-of-distribution texts (same formats; labels ignored): AUROC, FPR@95")
@out_option("directory for confidence.json/.md, PNGs and scores")
@click.option("--features", default=None, help="Mahalanobis features, comma-separated: cls, mean, pooled "
              "[default: all the model has]")
@click.option("--bins", type=int, default=15, show_default=True, help="equal-width calibration bins")
@click.option("--temperature", type=float, default=1.0, show_default=True, help="energy temperature T")
@click.option("--shrinkage", default="auto", show_default=True,
              help="covariance shrinkage: auto (Ledoit-Wolf) or a number in [0, 1]")
@dtype_option(help=None)
def scan_confidence(model_dir: str, texts_path: str, labels_path: str | None, fit_path: str | None,
                    ood_path: str | None, out_dir: str, features: str | None, bins: int, temperature: float,
                    shrinkage: str, dtype: str) -> None:
    """Confidence, calibration (ECE, reliability diagram) and OOD scores (MSP, energy, Mahalanobis)."""
    from pathlib import Path

    from ..security.confidence import ClassifierConfidenceAnalyzer, read_texts

    chosen = None if features is None else [f.strip() for f in features.split(",") if f.strip()]
    analyzer = ClassifierConfidenceAnalyzer.from_pretrained(model_dir, dtype=dtype, features=chosen, bins=bins,
                                                            temperature=temperature, shrinkage=shrinkage)
    texts, labels = read_texts(texts_path, labels_path)
    ood_texts = read_texts(ood_path)[0] if ood_path else None
    saved_fit = None
    if fit_path and Path(fit_path).suffix.lower() == ".npz":
        analyzer.load(fit_path)
    elif fit_path:
        analyzer.fit(*read_texts(fit_path))
        saved_fit = analyzer.save(Path(out_dir) / "mahalanobis_fit.npz")
    report = analyzer.analyze(texts, labels, ood_texts=ood_texts, model=model_dir)
    report.write(out_dir)
    parts = [f"{report.num_texts} texts", f"mean confidence {report.mean_confidence:.3f}"]
    if report.ece is not None:
        parts.append(f"accuracy {report.accuracy:.3f}, ECE {report.ece:.4f}")
    if report.best_score is not None:
        best = report.metrics(report.best_score)
        parts.append(f"best OOD score {best.score}: AUROC {best.auroc:.3f}, FPR@95 {best.fpr_at_95_tpr:.3f}")
    click.echo(f"wrote {out_dir}/confidence.md ({'; '.join(parts)})")
    if saved_fit is not None:
        click.echo(f"saved the Mahalanobis fit to {saved_fit} (pass it to --fit to score later without refitting)")


@scan.command("membership")
@model_dir_argument
@click.option("--members", "members_file", required=True, help="texts known to be in the training data")
@click.option("--non-members", "non_members_file", required=True, help="texts known not to be in it")
@click.option("--reference", default=None,
              help="a reference MLM with the same tokenizer (e.g. the model MODEL_DIR was trained from): adds the "
                   "calibrated score, target - reference")
@click.option("--score", "kind", type=click.Choice(["loss", "pll"]), default="loss", show_default=True,
              help="loss: MLM loss under fixed seeded masks; pll: pseudo-log-likelihood (one pass per token)")
@documents_option("how the text files hold texts: documents separated by blank lines, or one text per line")
@max_length_option(128, help="window length: longer texts are scored in consecutive windows")
@click.option("--max-windows", type=int, default=None, help="score at most this many windows per text")
@click.option("--draws", type=int, default=4, show_default=True, help="loss: mask draws per window")
@mask_rate_option("loss: share of tokens masked")
@click.option("--pll-max-tokens", type=int, default=128, show_default=True, help="pll: tokens scored per text")
@seed_option(help="seed of the masks")
@dtype_option()
@out_option("directory for membership.json, membership.md and PNGs")
def scan_membership(model_dir: str, members_file: str, non_members_file: str, reference: str | None, kind: str,
                    documents: str, max_length: int, max_windows: int | None, draws: int, mask_rate: float,
                    pll_max_tokens: int, seed: int, dtype: str, out_dir: str) -> None:
    """Membership inference against the MLM in MODEL_DIR: AUC and TPR at 1% FPR of members vs non-members."""
    from ..security.membership import MembershipInference, read_texts

    members, non_members = read_texts(members_file, documents), read_texts(non_members_file, documents)
    attack = MembershipInference.from_pretrained(
        model_dir, reference, dtype=dtype, max_length=max_length, max_windows=max_windows, draws=draws,
        mask_rate=mask_rate, pll_max_tokens=pll_max_tokens, seed=seed)
    report = attack.evaluate(members, non_members, kind)
    paths = report.write(out_dir)
    calibrated = (f"; calibrated AUC {report.calibrated_auc:.4f}, TPR@1%FPR {report.calibrated_tpr_at_1pct_fpr:.4f}"
                  if report.calibrated_auc is not None else "")
    click.echo(f"{kind} score: AUC {report.auc:.4f}, TPR@1%FPR {report.tpr_at_1pct_fpr:.4f}{calibrated} "
               f"({len(members)} members, {len(non_members)} non-members); report in {paths['markdown']}")
