"""Behaviour consistency of the shared SST-2 classifier (all-MiniLM-L6-v2 fine-tuned on the 20k SST-2
subset) under meaning-preserving edits (case, whitespace, punctuation, name swaps, typos), on SST-2 rows
it was never trained on.

    python bench/consistency.py [--texts 1000] [--seed 0] [--typos 1] [--dtype bf16]

Prints a table, writes bench/results/consistency.json and the report (Markdown, JSON, bar chart) in
bench/results/consistency/.
"""
from __future__ import annotations

import argparse
import time

from common import RESULTS, smoke_size, sst2_heldout, write_result
from smoke_training import sst2_classifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=smoke_size(1000, 12), help="held-out SST-2 texts to edit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--typos", type=int, default=1, help="typos per text in the typo edit")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    args = parser.parse_args()

    from encoderkit.security.consistency import BehaviorConsistencyValidator
    from encoderkit.tasks.classify import Classifier

    rows = sst2_heldout(args.texts)
    texts, gold = [text for text, _ in rows], [label for _, label in rows]
    model_dir = sst2_classifier()
    classifier = Classifier.from_pretrained(model_dir, dtype=args.dtype)
    validator = BehaviorConsistencyValidator(classifier, typos=args.typos)

    start = time.perf_counter()
    report = validator.validate(texts, seed=args.seed, model_name="sst2-classifier (all-MiniLM-L6-v2 fine-tuned)")
    seconds = time.perf_counter() - start
    report.write(RESULTS / "consistency")

    # Accuracy on the originals, and on each edit's edited texts (where a text changed its label, the edit's).
    original, _ = validator.predict(texts)
    accuracy = sum(p == g for p, g in zip(original, gold)) / len(gold)
    per_edit = []
    for edit in report.edits:
        flipped = {f.index: f.edited_label for f in edit.failures}
        applied = [i for i, item in enumerate(validator.edited_texts(texts, edit.edit, args.seed)) if item is not None]
        before = sum(original[i] == gold[i] for i in applied) / max(len(applied), 1)
        after = sum(flipped.get(i, original[i]) == gold[i] for i in applied) / max(len(applied), 1)
        per_edit.append({
            "edit": edit.edit, "texts": edit.texts, "same_tokens": edit.same_tokens, "consistent": edit.consistent,
            "consistency_rate": edit.consistency_rate, "mean_probability_shift": edit.mean_probability_shift,
            "max_probability_shift": edit.max_probability_shift, "accuracy_original": before,
            "accuracy_edited": after, "variants": edit.variants,
            "examples": [{"original": f.original, "edited": f.edited, "labels": [f.original_label, f.edited_label]}
                         for f in edit.failures[:3]],
        })

    print(f"{len(texts)} held-out SST-2 texts, accuracy {accuracy:.4f}, {args.dtype}, seed {args.seed}, "
          f"{seconds:.1f} s")
    print(f"{'edit':<12} {'texts':>6} {'same tok':>8} {'consistency':>11} {'mean shift':>10} {'acc orig':>8} "
          f"{'acc edit':>8}")
    for row in per_edit:
        print(f"{row['edit']:<12} {row['texts']:>6} {row['same_tokens']:>8} "
              f"{_number(row['consistency_rate'], '%'):>11} {_number(row['mean_probability_shift']):>10} "
              f"{row['accuracy_original']:>8.4f} {row['accuracy_edited']:>8.4f}")
    write_result("consistency", {
        "model": "sst2-classifier: all-MiniLM-L6-v2 fine-tuned on the 20k SST-2 subset (bench/common.py)",
        "texts": len(texts), "data": "sst2_heldout (SST-2 train rows outside the training subset)",
        "dtype": args.dtype, "seed": args.seed, "typos_per_text": args.typos, "accuracy": accuracy,
        "seconds": seconds, "edits": per_edit,
        "figure": "bench/results/consistency/consistency.png",
    })


def _number(value: float | None, unit: str = "") -> str:
    """A rate as a percentage (``unit`` "%") or a shift to 4 places; "-" where no text took the edit (None)."""
    if value is None:
        return "-"
    return f"{100 * value:.2f}%" if unit == "%" else f"{value:.4f}"


def render(result: dict) -> list[str]:
    lines = ["## Behaviour consistency under meaning-preserving edits (`bench/consistency.py`)", ""]
    try:
        from report import _machine

        lines += [_machine(result), ""]
    except Exception:  # the machine line is optional
        pass
    lines += [f"The shared SST-2 classifier ({result['dtype']}) on {result['texts']} held-out SST-2 texts (accuracy "
              f"{result['accuracy']:.4f}); seed {result['seed']}, {result['typos_per_text']} typo per text. "
              "Consistency = share of edited texts whose predicted label did not change; *same tokens* = edited "
              "texts the uncased tokenizer maps to the original's token ids.", "",
              "| edit | texts edited | same tokens | consistency | mean prob. shift | accuracy before | "
              "accuracy after |", "|---|---|---|---|---|---|---|"]
    for row in result["edits"]:
        lines.append(f"| {row['edit']} | {row['texts']} | {row['same_tokens']} | "
                     f"{_number(row['consistency_rate'], '%')} | "
                     f"{_number(row['mean_probability_shift'])} | {row['accuracy_original']:.4f} | "
                     f"{row['accuracy_edited']:.4f} |")
    lines += ["", "![consistency per edit](bench/results/consistency/consistency.png)", ""]
    return lines


if __name__ == "__main__":
    main()
