"""Membership inference against a continued-pre-trained MLM (issue 6, "Membership").

1. Split the documents of ../shared/data/mlm_corpus/train.txt (blank-line separated) into two seeded halves:
   members and non-members.
2. base = all-MiniLM-L6-v2 continued-pre-trained briefly on SST-2 sentences (../shared/data/sst2/train.tsv:
   movie-review phrases, disjoint from mlm_corpus, whose sources are WikiText, SQuAD dev, CoNLL and AG News).
   all-MiniLM-L6-v2 ships without an MLM head; this fits the fresh one so the base is a usable reference.
3. target = the base continued-pre-trained on the member half for 4 epochs, in two legs of 2 (bf16 autocast).
4. Score a seeded sample of members and non-members against the target: the MLM loss score (fixed seeded
   masks), the reference-calibrated score (target loss - base loss), and, on a smaller sample, the
   pseudo-log-likelihood (PLL) score, with and without the reference. Report AUC and TPR at 1% FPR.

Models are cached in bench/.cache/membership/ (delete it to retrain).

    python bench/membership.py [--sample 1000] [--pll-sample 150] [--threads 2] [--stage models|all]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import smoke_training
from common import RESULTS, SHARED, require, smoke_size, write_result

# A smoke run: the tiny random BERT of smoke_training as the start, 24 documents, 200 SST-2 lines, 2 steps a model of
# batch 4 x 32 tokens, 4 documents a side scored (2 by PLL over 8 tokens).
WORK = smoke_training.cache_dir("membership")
SPLIT_SEED = 0
DOCUMENTS, SST2_LINES = smoke_size(None, 24), smoke_size(None, 200)  # None: all
BASE_STEPS, BASE_LR = smoke_size(120, 2), 2e-4
TARGET_EPOCHS, TARGET_LEGS, TARGET_LR, TARGET_BUDGET_S = 2, 2, 3e-4, 2400
BATCH, MAX_LENGTH = smoke_size(32, 4), smoke_size(128, 32)
SAMPLE_SEED = 1
# Scoring: 4 mask draws per window, at most 4 windows (512 tokens) per document; PLL over the first 32 tokens.
SCORER = {"max_length": MAX_LENGTH, "draws": 4, "mask_rate": 0.15, "max_windows": 4,
          "pll_max_tokens": smoke_size(32, 8), "seed": 0}


def read_documents(path: Path) -> list[str]:
    """Blank-line separated documents, each one string (its lines joined by newlines)."""
    from encoderkit.data.corpus import read_documents as read

    return ["\n".join(lines) for lines in read(path, "blank-line")]


def split_documents() -> tuple[list[str], list[str]]:
    """The seeded halves (members, non-members) of mlm_corpus/train.txt, each in corpus order."""
    documents = read_documents(require(SHARED / "data" / "mlm_corpus" / "train.txt"))[:DOCUMENTS]
    order = np.random.default_rng(SPLIT_SEED).permutation(len(documents))
    half = len(documents) // 2
    members, non_members = np.sort(order[:half]), np.sort(order[half:])
    return [documents[i] for i in members], [documents[i] for i in non_members]


def write_documents(path: Path, documents: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return path


def train(corpus: Path, out: Path, *, config, steps: int, lr: float, document_mode: str,
          budget_s: float | None = None) -> dict:
    """Continue pre-training (MLM, bf16 autocast where the CPU has native bf16); cached in ``out``."""
    from encoderkit.precision import cpu_has_native_bf16
    from encoderkit.training.pretrain import pretrain

    done = out / "done.json"
    if done.is_file() and (out / "final" / "model.safetensors").is_file():
        return json.loads(done.read_text())
    start = time.perf_counter()
    result = pretrain(corpus, out, config=str(config), max_length=MAX_LENGTH, document_mode=document_mode,
                      max_steps=steps, batch_size=BATCH, learning_rate=lr, warmup_ratio=0.06,
                      bf16=cpu_has_native_bf16(), save_every=0, eval_every=0, keep_last=1, seed=0,
                      time_budget_s=budget_s, show_progress=False)
    facts = {"steps": result["step"], "planned_steps": steps, "sequences": result["examples"],
             "seconds": time.perf_counter() - start, "learning_rate": lr,
             "final_train_loss": result["history"][-1]["loss"] if result["history"] else None}
    done.write_text(json.dumps(facts, indent=2) + "\n")
    return facts


def build_models(members: list[str]) -> dict:
    from encoderkit import default_model_path

    # SST-2 phrases, one per line: a corpus disjoint from mlm_corpus for fitting the fresh MLM head.
    lines = require(SHARED / "data" / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:][:SST2_LINES]
    sst2 = WORK / "base_corpus.txt"
    if not sst2.is_file():
        sst2.parent.mkdir(parents=True, exist_ok=True)
        sst2.write_text("\n".join(line.split("\t")[0].strip() for line in lines) + "\n", encoding="utf-8")
    origin = smoke_training.tiny_model() or default_model_path()
    base = train(sst2, WORK / "base", config=origin, steps=BASE_STEPS, lr=BASE_LR, document_mode="line")
    print(f"base: {base}")
    member_file = WORK / "members.txt"
    if not member_file.is_file():
        write_documents(member_file, members)
    # Steps for TARGET_EPOCHS passes over the packed member sequences (about 1 token in 1.3 words).
    tokens = sum(len(d.split()) for d in members) * 1.3
    steps = smoke_size(int(TARGET_EPOCHS * tokens / ((MAX_LENGTH - 2) * BATCH)), 2)
    # Legs of TARGET_EPOCHS epochs, each continuing from the last with its own warmup and linear decay: a
    # resumable way to add epochs (2 epochs left little trace: loss-score AUC 0.53).
    legs, start = [], WORK / "base" / "final"
    for leg in range(TARGET_LEGS):
        out = WORK / ("target" if leg == 0 else f"target-leg{leg + 1}")
        legs.append(train(member_file, out, config=start, steps=steps, lr=TARGET_LR, document_mode="blank-line",
                          budget_s=TARGET_BUDGET_S))
        start = out / "final"
    target = {"steps": sum(leg["steps"] for leg in legs), "sequences": legs[0]["sequences"], "legs": len(legs),
              "seconds": sum(leg["seconds"] for leg in legs), "learning_rate": TARGET_LR,
              "final_train_loss": legs[-1]["final_train_loss"], "model": str(start.relative_to(WORK))}
    print(f"target: {target}")
    return {"base": base, "target": target}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=1000, help="members and non-members scored (each)")
    parser.add_argument("--pll-sample", type=int, default=150, help="members and non-members for PLL (each); 0: skip")
    parser.add_argument("--stage", choices=["models", "all"], default="all")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 runs better on a shared CPU)")
    args = parser.parse_args()
    args.sample, args.pll_sample = smoke_size(args.sample, 4), smoke_size(args.pll_sample, min(args.pll_sample, 2))
    torch.set_num_threads(args.threads)
    from encoderkit.reports import roc_auc
    from encoderkit.security.membership import MembershipInference

    members, non_members = split_documents()
    training = build_models(members)
    if args.stage == "models":
        return
    rng = np.random.default_rng(SAMPLE_SEED)
    sample_members = [members[i] for i in rng.choice(len(members), min(args.sample, len(members)), replace=False)]
    sample_non_members = [non_members[i]
                          for i in rng.choice(len(non_members), min(args.sample, len(non_members)), replace=False)]
    result = {"documents": {"members": len(members), "non_members": len(non_members)}, "training": training,
              "scored": {"members": len(sample_members), "non_members": len(sample_non_members)},
              "settings": {**SCORER, "dtype": "bf16"}, "scores": {}}
    runs = [("loss", sample_members, sample_non_members)]
    if args.pll_sample:
        runs.append(("pll", sample_members[:args.pll_sample], sample_non_members[:args.pll_sample]))
    attack = MembershipInference.from_pretrained(WORK / training["target"]["model"], reference=WORK / "base" / "final",
                                                 dtype="bf16", **SCORER)
    for kind, kind_members, kind_non_members in runs:
        report = attack.evaluate(kind_members, kind_non_members, kind)
        out = RESULTS / "membership" / kind
        out.mkdir(parents=True, exist_ok=True)
        pictures = report.figures(out)
        (out / "membership.md").write_text(report.markdown(), encoding="utf-8")
        reference_auc = roc_auc(-np.asarray(report.member_scores["reference"]),
                                -np.asarray(report.non_member_scores["reference"]))
        result["scores"][kind] = {
            "members": report.members, "non_members": report.non_members, "seconds": report.seconds,
            "auc": report.auc, "tpr_at_1pct_fpr": report.tpr_at_1pct_fpr, "calibrated_auc": report.calibrated_auc,
            "calibrated_tpr_at_1pct_fpr": report.calibrated_tpr_at_1pct_fpr, "reference_alone_auc": reference_auc,
            "mean_scores": report.mean_scores,
            "plots": [str(p.relative_to(RESULTS.parent.parent)) for p in pictures]}
        print(f"{kind}: {report.members} vs {report.non_members} texts in {report.seconds:.0f} s")
        print(report.markdown())
    loss = result["scores"]["loss"]
    met = loss["calibrated_auc"] >= loss["auc"]
    result["acceptance"] = {"calibrated_auc_ge_loss_auc": met, "met": met}
    write_result("membership", result)


def render(result: dict) -> list[str]:
    training = result["training"]
    lines = ["## Membership inference (`bench/membership.py`)", "",
             f"Documents of `mlm_corpus/train.txt` split into seeded halves ({result['documents']['members']:,} members, "
             f"{result['documents']['non_members']:,} non-members). Base = all-MiniLM-L6-v2 with its MLM head fitted on "
             f"SST-2 sentences ({training['base']['steps']} steps); target = the base continued-pre-trained on the "
             f"member half ({training['target']['steps']} steps of 32 x 128 tokens in {training['target']['legs']} legs, each "
             "with its own warmup and linear decay, about "
             f"{training['target']['steps'] * 32 / max(training['target']['sequences'], 1):.1f} epochs, bf16 autocast, "
             f"{training['target']['seconds'] / 60:.0f} min on a shared 2-core CPU). Reference = the base. Scores: mean "
             "negative log-likelihood per token (loss: fixed seeded masks; PLL: each token masked in turn), lower = "
             "member; members are the positives.", "",
             "| score | texts (members + non-members) | AUC target alone | TPR@1%FPR | AUC calibrated (target - base) "
             "| TPR@1%FPR | AUC base alone |",
             "|---|---|---|---|---|---|---|"]
    for kind, row in result["scores"].items():
        lines.append(f"| {kind} | {row['members']} + {row['non_members']} | {row['auc']:.4f} | "
                     f"{row['tpr_at_1pct_fpr']:.4f} | {row['calibrated_auc']:.4f} | "
                     f"{row['calibrated_tpr_at_1pct_fpr']:.4f} | {row['reference_alone_auc']:.4f} |")
    verdict = "met" if result["acceptance"]["calibrated_auc_ge_loss_auc"] else "NOT met"
    lines += ["", f"Acceptance (calibrated AUC >= loss-only AUC): {verdict}.", ""]
    for kind, row in result["scores"].items():
        lines += [f"![membership {kind} {Path(p).stem}]({p})" for p in row["plots"]]
    return lines


if __name__ == "__main__":
    main()
