"""Adversarial attacks and embedding-shift detection on the shared SST-2 classifier.

1. Held-out SST-2 texts (never trained on; 8 to 40 words), split into a calibration half and an evaluation half.
2. The attack module attacks every text (greedy word substitution; word insertion on the evaluation half):
   attack success rate, perturbed-word rate, queries.
3. Benign edits of every text, seeded: one or two typos (swap / drop / double / keyboard-neighbour letter),
   and a case change (upper-case, title-case, one word upper-cased).
4. Pair mode: the shift of (original, adversarial) vs (original, unmodified / typo / case) for every
   representation; the threshold is calibrated at 5% FPR on the calibration half, and AUROC, FPR and TPR are
   reported on the evaluation half only. Single-text mode: each text's distance to its 10 nearest neighbours
   among 2,000 SST-2 training texts, same splits.
5. Leave-one-out attribution: how often the top-attributed word of an adversarial pair is a perturbed word.

    python bench/shift.py [--texts 400] [--budget 300] [--threads 1]

Writes bench/results/shift.json and bench/results/shift/shift_scores.png.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import numpy as np

import smoke_training
from common import RESULTS, smoke_size, sst2_heldout, sst2_rows, write_result

REPRESENTATIONS = ("cls", "pooled", "mean", "logits", "probabilities", "embedding")
FPR = 0.05
KEYBOARD = {c: n for row in ("qwertyuiop", "asdfghjkl", "zxcvbnm") for i, c in enumerate(row)
            for n in [row[max(i - 1, 0)] + row[min(i + 1, len(row) - 1)]]}


# ---------------------------------------------------------------------------------------------
# Benign edits (seeded, meaning-preserving for a human reader)
# ---------------------------------------------------------------------------------------------
def typo(word: str, rng: random.Random) -> str:
    i = rng.randrange(1, len(word) - 1)  # keep the first letter, as most real typos do
    kind = rng.choice(["swap", "drop", "double", "keyboard"])
    if kind == "swap":
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if kind == "drop":
        return word[:i] + word[i + 1:]
    if kind == "double":
        return word[:i] + word[i] + word[i:]
    return word[:i] + rng.choice(KEYBOARD.get(word[i], word[i])) + word[i + 1:]


def typo_edit(text: str, rng: random.Random) -> str:
    words = text.split(" ")
    long_words = [i for i, w in enumerate(words) if w.isalpha() and len(w) >= 4]
    for i in rng.sample(long_words, min(len(long_words), rng.choice([1, 2]))):
        words[i] = typo(words[i], rng)
    return " ".join(words)


def case_edit(text: str, rng: random.Random) -> str:
    kind = rng.choice(["upper", "title", "word"])
    if kind == "upper":
        return text.upper()
    if kind == "title":
        return text.title()
    words = text.split(" ")
    i = rng.randrange(len(words))
    words[i] = words[i].upper()
    return " ".join(words)


# ---------------------------------------------------------------------------------------------
def attack_records(classifier, texts: list[str], labels: list[str], method: str, budget: int,
                   key: str) -> tuple[dict[str, Any], float]:
    """Attack results (cached in bench/.cache/shift: the detection part can be re-run without re-attacking)."""
    from encoderkit.security.attacks import WordAttack

    cache = smoke_training.cache_dir("shift") / f"attack-{key}-{method}-{budget}.json"
    if cache.is_file():
        saved = json.loads(cache.read_text())
        return saved["result"], saved["seconds"]
    start = time.perf_counter()
    result = WordAttack(classifier, method=method, query_budget=budget, max_perturbed_rate=0.25,
                        neighbours=20).attack(texts, labels)
    seconds = time.perf_counter() - start
    data = result.to_dict()
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"result": data, "seconds": seconds}))
    return data, seconds


def attack_summary(data: dict[str, Any], seconds: float) -> dict[str, Any]:
    keys = ("texts", "attacked", "successes", "success_rate", "mean_perturbed_rate", "mean_queries",
            "accuracy_before", "accuracy_after")
    queries = sum(r["queries"] for r in data["records"])
    return {**{k: data[k] for k in keys}, "seconds": seconds, "queries_per_second": queries / seconds}


def evaluate(scores: dict[str, np.ndarray], split: dict[str, np.ndarray]) -> dict[str, float]:
    """Threshold from the calibration half's benign scores, metrics on the evaluation half."""
    from encoderkit.reports import roc_auc, tpr_at_fpr
    from encoderkit.security.shift import calibrated_threshold

    cal, ev = split["calibration"], split["evaluation"]
    benign_cal = np.concatenate([scores[kind][cal] for kind in ("unmodified", "typo", "case")])
    benign_ev = {kind: scores[kind][ev] for kind in ("unmodified", "typo", "case")}
    all_benign_ev = np.concatenate(list(benign_ev.values()))
    adversarial_ev = scores["adversarial"][split["adversarial_evaluation"]]
    adversarial_cal = scores["adversarial"][split["adversarial_calibration"]]
    threshold = calibrated_threshold(benign_cal, FPR)
    return {
        "threshold": threshold,
        "auroc": roc_auc(adversarial_ev, all_benign_ev),
        "auroc_vs_typo": roc_auc(adversarial_ev, benign_ev["typo"]),
        "auroc_calibration_half": roc_auc(adversarial_cal, benign_cal),
        "fpr_calibration_half": float(np.mean(benign_cal > threshold)),
        "fpr": float(np.mean(all_benign_ev > threshold)),
        "fpr_typo": float(np.mean(benign_ev["typo"] > threshold)),
        "tpr": float(np.mean(adversarial_ev > threshold)),
        "tpr_at_5pct_fpr_oracle": tpr_at_fpr(adversarial_ev, all_benign_ev, FPR),
    }


def plot(scores: dict[str, np.ndarray], split: dict[str, np.ndarray], threshold: float, representation: str,
         path) -> None:
    from encoderkit.reports import new_figure, save_figure

    figure, axis = new_figure(7.5, 4.2)
    ev = split["evaluation"]
    groups = {"typo edit": scores["typo"][ev], "case edit": scores["case"][ev],
              "adversarial (substitution)": scores["adversarial"][split["adversarial_evaluation"]]}
    positive = np.concatenate([g[g > 0] for g in groups.values()])
    bins = np.logspace(np.log10(max(positive.min(), 1e-7)), np.log10(positive.max()), 40)
    for (name, values), color in zip(groups.items(), ("tab:blue", "tab:green", "tab:red")):
        zeros = int(np.sum(values <= 0))
        axis.hist(np.clip(values[values > 0], bins[0], None), bins=bins, alpha=0.55, color=color,
                  label=f"{name}: {len(values)}" + (f" ({zeros} exactly 0, not drawn)" if zeros else ""))
    axis.axvline(threshold, color="black", linestyle="--", label="threshold (5% FPR on the calibration half)")
    axis.set_xscale("log")
    axis.set_xlabel(f"pair shift, representation '{representation}' (log scale)")
    axis.set_ylabel("pairs (evaluation half)")
    axis.set_title("Embedding shift: adversarial vs benign edits, SST-2 classifier")
    axis.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(figure, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=400, help="held-out SST-2 texts (half calibration, half evaluation)")
    parser.add_argument("--budget", type=int, default=300, help="attack queries per text")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: small batches on a shared CPU run fastest single-threaded)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)

    from encoderkit.precision import cpu_has_native_bf16
    from encoderkit.security.attacks import WordSequence
    from encoderkit.tasks.classify import Classifier

    # A smoke run: smoke_training's classifier, 24 texts attacked, 32 reference texts.
    dtype = "bf16" if cpu_has_native_bf16() else "fp32"
    classifier = Classifier.from_pretrained(smoke_training.sst2_classifier(), dtype=dtype)
    rng = random.Random(0)
    rows = [(t, l) for t, l in sst2_heldout(4000) if 8 <= len(WordSequence.from_text(t)) <= 40]
    rng.shuffle(rows)
    rows = rows[:smoke_size(args.texts, 24)]
    texts, labels = [t for t, _ in rows], [l for _, l in rows]
    print(f"{len(texts)} held-out SST-2 texts, {dtype}; attacking (substitution, budget {args.budget}) ...")
    attacks, substitution, insertion = run_attacks(classifier, texts, labels, args.budget)

    # Pairs: every text unmodified, with a typo, with a case change; the successful adversarial examples.
    half = len(texts) // 2
    won = [r for r in substitution["records"] if r["success"]]
    adversarial_index = np.asarray([r["index"] for r in won])
    split = {"calibration": np.arange(half), "evaluation": np.arange(half, len(texts)),
             "adversarial_calibration": np.flatnonzero(adversarial_index < half),
             "adversarial_evaluation": np.flatnonzero(adversarial_index >= half)}
    inserted = [r for r in insertion["records"] if r["success"]]
    reference = [t for t, _ in sst2_rows()[:smoke_size(2000, 32)]]
    pair, single, per_representation, embedder = detect(classifier, dtype, texts, won, inserted, split, reference)

    # The representation is chosen on the calibration half (AUROC there), never on the reported half.
    chosen = max(REPRESENTATIONS, key=lambda r: pair[r]["auroc_calibration_half"])
    chosen_single = max(REPRESENTATIONS, key=lambda r: single[r]["auroc_calibration_half"])
    plot(per_representation[chosen], split, pair[chosen]["threshold"], chosen, RESULTS / "shift" / "shift_scores.png")
    attribution = attribute(classifier, embedder, [won[j] for j in split["adversarial_evaluation"]], chosen)
    print(f"chosen representation (calibration half): {chosen}; evaluation-half AUROC {pair[chosen]['auroc']:.4f}")

    write_result("shift", {
        "texts": len(texts), "calibration_texts": half, "evaluation_texts": len(texts) - half, "dtype": dtype,
        "query_budget": args.budget, "max_perturbed_rate": 0.25, "neighbours": 20, "target_fpr": FPR,
        "adversarial_pairs": {"calibration": int(len(split["adversarial_calibration"])),
                              "evaluation": int(len(split["adversarial_evaluation"])),
                              "insertion_evaluation": len(inserted)},
        "attacks": attacks, "pair": pair, "single": single, "chosen": chosen, "chosen_single": chosen_single,
        "attribution": attribution, "reference_texts": len(reference), "goal_auroc": 0.85,
        "goal": {"auroc_at_least": 0.85, "auroc": pair[chosen]["auroc"], "met": pair[chosen]["auroc"] >= 0.85},
    })


def run_attacks(classifier, texts: list[str], labels: list[str], budget: int) -> tuple[dict, dict, dict]:
    """Substitution on every text, insertion on the evaluation half: their summaries and their records."""
    half = len(texts) // 2
    key = f"{len(texts)}"
    substitution, sub_seconds = attack_records(classifier, texts, labels, "substitute", budget, key)
    insertion, ins_seconds = attack_records(classifier, texts[half:], labels[half:], "insert", budget,
                                            key + "-evaluation")
    attacks = {"substitute": attack_summary(substitution, sub_seconds),
               "insert (evaluation half)": attack_summary(insertion, ins_seconds)}
    for name, summary in attacks.items():
        print(f"  {name}: success {summary['success_rate']:.3f} ({summary['successes']}/{summary['attacked']}), "
              f"perturbed-word rate {summary['mean_perturbed_rate']:.3f}, mean queries {summary['mean_queries']:.1f}, "
              f"{summary['seconds']:.0f} s")
    return attacks, substitution, insertion


def detect(classifier, dtype: str, texts: list[str], won: list[dict], inserted: list[dict],
           split: dict[str, np.ndarray], reference: list[str]) -> tuple[dict, dict, dict, Any]:
    """Pair and single-text shift scores of every representation, evaluated: (pair metrics, single-text metrics,
    the pair scores per representation, the embedder)."""
    from encoderkit.reports import roc_auc
    from encoderkit.security.shift import EmbeddingShiftDetector
    from encoderkit.tasks.embed import Embedder

    edit_rng = random.Random(1)
    typos = [typo_edit(t, edit_rng) for t in texts]
    cases = [case_edit(t, edit_rng) for t in texts]
    adversarial_index = [r["index"] for r in won]
    adversarial = [r["adversarial"] for r in won]
    embedder = Embedder.from_pretrained(dtype=dtype)
    pair, single, per_representation = {}, {}, {}
    for representation in REPRESENTATIONS:
        detector = EmbeddingShiftDetector(classifier, representation=representation, embedder=embedder)
        start = time.perf_counter()
        originals = texts * 3 + [texts[i] for i in adversarial_index] + [r["original"] for r in inserted]
        modifieds = texts + typos + cases + adversarial + [r["adversarial"] for r in inserted]
        shifts = detector.shift_scores(originals, modifieds)
        n, a = len(texts), len(adversarial)
        scores = {"unmodified": shifts[:n], "typo": shifts[n:2 * n], "case": shifts[2 * n:3 * n],
                  "adversarial": shifts[3 * n:3 * n + a]}
        pair[representation] = evaluate(scores, split)
        insert_scores = shifts[3 * n + a:]
        pair[representation]["auroc_insertion"] = (
            roc_auc(insert_scores, np.concatenate([scores[k][split["evaluation"]] for k in ("unmodified", "typo", "case")]))
            if len(insert_scores) else None)
        per_representation[representation] = scores
        # Single-text mode: each text alone against the training distribution.
        detector.fit_reference(reference)
        singles = detector.distribution_scores(texts + typos + cases + adversarial)
        single_scores = {"unmodified": singles[:n], "typo": singles[n:2 * n], "case": singles[2 * n:3 * n],
                         "adversarial": singles[3 * n:]}
        single[representation] = evaluate(single_scores, split)
        print(f"  {representation:>13}: pair AUROC {pair[representation]['auroc']:.4f} "
              f"(vs typos {pair[representation]['auroc_vs_typo']:.4f}, FPR {pair[representation]['fpr']:.3f}, "
              f"TPR {pair[representation]['tpr']:.3f}); single-text AUROC {single[representation]['auroc']:.4f} "
              f"[{time.perf_counter() - start:.0f} s]")
    return pair, single, per_representation, embedder


def attribute(classifier, embedder, evaluation_pairs: list[dict], chosen: str) -> dict[str, Any]:
    """Leave-one-out attribution on the evaluation half's adversarial pairs: is the top word a perturbed one?"""
    from encoderkit.security.attacks import WordSequence
    from encoderkit.security.shift import EmbeddingShiftDetector

    attribution: dict[str, Any] = {
        "pairs": len(evaluation_pairs),
        # A word drawn at random is a perturbed one this often: the baseline the top-1 rate should beat.
        "random_word_baseline": float(np.mean([len(r["perturbations"]) / len(WordSequence.from_text(r["adversarial"]))
                                               for r in evaluation_pairs])),
        "top1_is_perturbed": {}, "examples": []}
    for representation in REPRESENTATIONS:
        detector = EmbeddingShiftDetector(classifier, representation=representation, embedder=embedder)
        hits = []
        for record in evaluation_pairs:
            _, words = detector.attribute(record["original"], record["adversarial"])
            top = max(words, key=lambda w: w.attribution)
            perturbed = {p["position"] for p in record["perturbations"]}
            hits.append(top.position in perturbed)
            if representation == chosen and len(attribution["examples"]) < 6:
                attribution["examples"].append({
                    "original": record["original"], "adversarial": record["adversarial"], "label": record["label"],
                    "prediction": record["adversarial_prediction"], "top_word": top.word,
                    "top_is_perturbed": top.position in perturbed})
        attribution["top1_is_perturbed"][representation] = float(np.mean(hits))
        print(f"  {representation:>13}: top-1 attribution is a perturbed word in {np.mean(hits):.3f} of {len(hits)} "
              f"adversarial pairs (random word: {attribution['random_word_baseline']:.3f})")
    return attribution


def render(result: dict[str, Any]) -> list[str]:
    from report import _machine

    attacks, pair, single, chosen = result["attacks"], result["pair"], result["single"], result["chosen"]
    lines = ["## Adversarial attacks and shift detection (`bench/shift.py`)", "", _machine(result), "",
             f"The shared SST-2 classifier (all-MiniLM-L6-v2 fine-tuned on the 20k subset, {result['dtype']}); "
             f"{result['texts']} held-out SST-2 texts of 8-40 words, half for calibration, half for evaluation. "
             f"Attacks: query budget {result['query_budget']} per text, at most "
             f"{result['max_perturbed_rate']:.0%} of a text's words changed, {result['neighbours']} input-embedding "
             "neighbours per word.", "",
             "| attack | texts | attacked (correct) | success rate | perturbed-word rate | mean queries | accuracy after | time |",
             "|---|---|---|---|---|---|---|---|"]
    for name, a in attacks.items():
        lines.append(f"| {name} | {a['texts']} | {a['attacked']} | {a['success_rate']:.3f} | "
                     f"{a['mean_perturbed_rate']:.3f} | {a['mean_queries']:.1f} | {a['accuracy_after']:.3f} | "
                     f"{a['seconds']:.0f} s ({a['queries_per_second']:.0f} queries/s) |")
    counts = result["adversarial_pairs"]
    lines += ["", f"Detection: successful substitution adversarials ({counts['evaluation']} in the evaluation half) "
              "vs the same texts unmodified, with one or two typos, and with a case change (3 benign pairs per "
              f"text). Threshold: 5% FPR on the calibration half's benign pairs ({counts['calibration']} "
              "adversarials there are used only to choose the representation). AUROC/FPR/TPR on the evaluation half.",
              "", "| representation | pair AUROC | AUROC vs typos only | FPR | TPR | AUROC, insertion attack | "
                  "single-text AUROC | top-1 attribution is perturbed |", "|---|---|---|---|---|---|---|---|"]
    for name, p in pair.items():
        mark = " (chosen)" if name == chosen else ""
        insertion = f"{p['auroc_insertion']:.4f}" if p.get("auroc_insertion") is not None else "-"
        lines.append(f"| {name}{mark} | {p['auroc']:.4f} | {p['auroc_vs_typo']:.4f} | {p['fpr']:.3f} | "
                     f"{p['tpr']:.3f} | {insertion} | {single[name]['auroc']:.4f} | "
                     f"{result['attribution']['top1_is_perturbed'][name]:.3f} |")
    att = result["attribution"]
    verdict = "met" if pair[chosen]["auroc"] >= result["goal_auroc"] else "NOT met"
    lines += ["", f"Goal AUROC >= {result['goal_auroc']}: **{verdict}** (pair mode, `{chosen}`: "
              f"{pair[chosen]['auroc']:.4f}; the representation with the best AUROC on the calibration half). "
              "The unmodified and case-changed pairs (an uncased model) shift by exactly 0, so the AUROC against "
              "typos alone is the harder number. Single-text mode (distance to the 10 nearest of "
              f"{result['reference_texts']:,} training texts, no original to compare with) is much weaker. "
              f"Leave-one-out attribution: share of the {att['pairs']} adversarial pairs whose most responsible word "
              f"is a perturbed one (a random word would be: {att['random_word_baseline']:.3f}).", "",
              "Caveat: input-embedding neighbours include antonyms, so many successful \"adversarial\" substitutions "
              "change the meaning (examples below); the detector flags label-changing edits, whatever their intent.",
              "", "| original | adversarial | label -> prediction | top word |", "|---|---|---|---|"]
    cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731 - a table cell must not end early
    lines += [f"| {cell(e['original'])} | {cell(e['adversarial'])} | {e['label']} -> {e['prediction']} | "
              f"{cell(e['top_word'])} |" for e in att["examples"]]
    lines += ["",
              "![shift scores](bench/results/shift/shift_scores.png)", ""]
    return lines


if __name__ == "__main__":
    main()
