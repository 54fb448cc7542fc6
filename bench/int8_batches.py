"""How far int8 vectors are from fp32 ones when texts share a batch, against what the int8 guard measured.

int8 products quantise each product's input rows each with its own scale and zero point (``modeling.int8_rows``,
and the native kernel's ``quantize``), so a text's int8 vector should not depend on its batch. Until they did (one
scale and zero point for the whole packed batch), one text with outlier activations coarsened every text in its
batch: this script measured that. The int8 guard (``encoderkit.quantization``) measures its 40 short calibration
texts in one batch when the model is prepared. This script encodes N texts of ../shared/bench/sentences.txt
in int8 at several batch sizes, through the engine's default path (the native kernel where it applies) and through
the PyTorch int8 layers (``native.disable``), and gives each text's cosine to its fp32 vector (fp32: batches of 32;
fp32 is the same at any batch size to 1e-6). Reported: mean, worst, and how many texts fall under the guard's
worst-text threshold, next to the guard's own numbers.

    flock -x /tmp/bench.lock python bench/int8_batches.py [--model DIR] [--texts 500] [--batch-sizes 1 8 32]
        [--result int8_batches]

``--result``: the file under bench/results/ (a run of another model must not replace the default model's).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import SHARED, require, smoke_size, write_result

THREADS = 2
DEFAULT_NAME = "all-MiniLM-L6-v2 (the default model)"
OLD_SCHEME = "int8 quantised each product's input with one scale for the whole packed batch"  # results before
SCHEME = "int8 quantises each row of a product's input (each token) with its own scale and zero point"


def cosines(embedder, reference: np.ndarray, texts: list[str], batch_size: int) -> np.ndarray:
    """Each text's cosine between ``embedder``'s normalised vector at ``batch_size`` and ``reference``'s."""
    vectors = embedder.encode(texts, batch_size=batch_size, normalize=True)
    return (vectors * reference).sum(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a sentence-transformers directory (default: the default model)")
    parser.add_argument("--texts", type=int, default=smoke_size(500, 16))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument("--result", default="int8_batches")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    from encoderkit import Embedder, default_model_path, native
    from encoderkit.quantization import MEAN_COSINE_MIN, WORST_COSINE_MIN, QuantizationReport

    model_dir = args.model or default_model_path()
    texts = require(args.shared / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines()[:args.texts]
    reference = Embedder.from_pretrained(model_dir, dtype="fp32").encode(texts, batch_size=32, normalize=True)
    paths = {"engine (native kernel where it applies)": Embedder.from_pretrained(model_dir, dtype="int8"),
             "PyTorch int8 layers": Embedder.from_pretrained(model_dir, dtype="int8")}
    native.disable(paths["PyTorch int8 layers"].engine.encoder)
    guard = paths["engine (native kernel where it applies)"].engine.quantization  # the guard's report
    rows = []
    for path, embedder in paths.items():
        for batch_size in args.batch_sizes:
            values = cosines(embedder, reference, texts, batch_size)
            row = {"path": path, "batch_size": batch_size, "mean_cosine": float(values.mean()),
                   "worst_cosine": float(values.min()), "under_worst_min": int((values < WORST_COSINE_MIN).sum())}
            rows.append(row)
            print(f"  {path:40s} batch {batch_size:3d}: mean {row['mean_cosine']:.4f}, worst "
                  f"{row['worst_cosine']:.4f}, {row['under_worst_min']} under {WORST_COSINE_MIN}", flush=True)
    largest = max(args.batch_sizes)
    worst = next(row for row in rows if row["path"].startswith("engine") and row["batch_size"] == largest)
    # judged as the guard judges its own texts (its thresholds, QuantizationReport.ok)
    within = QuantizationReport(len(texts), worst["mean_cosine"], worst["worst_cosine"]).ok
    goals = [{"goal": f"int8 vectors in batches of {largest} within the guard's thresholds (mean cosine to fp32 >= "
                      f"{MEAN_COSINE_MIN}, every text >= {WORST_COSINE_MIN})",
              "measured": f"mean {worst['mean_cosine']:.4f}, worst {worst['worst_cosine']:.4f}, "
                          f"{worst['under_worst_min']} of {len(texts)} texts under {WORST_COSINE_MIN}",
              "met": within},
             {"goal": "the int8 guard's verdict agrees with these texts in batches",
              "measured": f"the guard {'passed' if guard.ok else 'warned'} (mean {guard.mean_cosine:.4f}, worst "
                          f"{guard.worst_cosine:.4f} on its {guard.texts} texts)",
              "met": guard.ok == within}]
    for goal in goals:
        print(f"goal: {goal['goal']}: {goal['measured']} -> {'met' if goal['met'] else 'not met'}")
    write_result(args.result, {"model": Path(model_dir).name if args.model else DEFAULT_NAME, "texts": len(texts),
                               "scheme": SCHEME,
                               "threads": THREADS, "native": native.status(), "rows": rows, "goals": goals,
                               "guard": {"ok": guard.ok, "mean_cosine": guard.mean_cosine,
                                         "worst_cosine": guard.worst_cosine, "texts": guard.texts}},
                 benchmark="int8_batches")


def render(r: dict[str, Any]) -> list[str]:
    from report import _table

    g = r["guard"]
    model = DEFAULT_NAME if r["model"] == "model" else r["model"]  # the default model's directory is named "model"
    lines = [f"### int8 vectors against fp32 by batch size: {model} (`bench/int8_batches.py`)", "",
             f"{r['texts']:,} texts of sentences.txt, {r['threads']} threads; each text's cosine between its int8 "
             "vector at each batch size and its fp32 vector. "
             f"{r.get('scheme', OLD_SCHEME)}. "
             "The native "
             f"kernel: {r['native']}. The int8 guard, when the model was prepared: mean {g['mean_cosine']:.4f}, worst "
             f"{g['worst_cosine']:.4f} on its {g['texts']} calibration texts ({'passed' if g['ok'] else 'warned'}).",
             ""]
    lines += _table(["path", "batch size", "mean cosine", "worst cosine", "texts under the guard's worst minimum"],
                    [[row["path"], str(row["batch_size"]), f"{row['mean_cosine']:.4f}", f"{row['worst_cosine']:.4f}",
                      str(row["under_worst_min"])] for row in r["rows"]])
    lines += [""] + [f"- {goal['goal']}: {goal['measured']}: **{'met' if goal['met'] else 'not met'}**"
                     for goal in r["goals"]]
    return lines


if __name__ == "__main__":
    main()
