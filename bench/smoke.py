"""What the benchmark scripts share in a smoke run (``common.SMOKE``, set by ``python -m bench run NAME --smoke``).

A smoke run checks that a benchmark still runs end to end, on a few texts and rows: the scripts shrink their sizes
with ``common.smoke_size`` where they choose them, and these helpers for what several of them shrink alike (a list
cut to its first items, the matmul peak at a small shape) and for the parts a machine cannot run (a GPU, a peer
library): those are skipped with the reason printed, and the rest still runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import torch

import common
from common import SMOKE, smoke_size

T = TypeVar("T")


def few(items: list[T], small: int) -> list[T]:
    """``items``, or its first ``small`` in a smoke run."""
    return items[:smoke_size(len(items), small)]


def skip(part: str, reason: str) -> None:
    """Say that a smoke run leaves ``part`` out, and why (what this machine lacks, or a cost no size reduces)."""
    print(f"smoke run: {part} skipped: {reason}", flush=True)


def matmul_peak(dtype: torch.dtype) -> float:
    """``common.matmul_peak`` at its shape, or at 64 rows once in a smoke run (its figure then means nothing)."""
    if not SMOKE:
        return common.matmul_peak(dtype)
    return common.matmul_peak(dtype, size=(64, 384, 1536), repeats=1)


def device(requested: str) -> str:
    """``requested``, or the CPU in a smoke run on a machine without CUDA (the GPU comparison skipped, said so)."""
    if SMOKE and requested.startswith("cuda") and not torch.cuda.is_available():
        skip("the CUDA comparison", "no CUDA device here; the CPU stands in for the GPU (a check of the script)")
        return "cpu"
    return requested


def sst2_classifier() -> Path:
    """``common.sst2_classifier()``: all-MiniLM-L6-v2 fine-tuned on the SST-2 subset; in a smoke run, the same recipe
    on its first 64 rows (two steps), cached apart in ``common.CACHE``."""
    if not SMOKE:
        return common.sst2_classifier()
    from encoderkit.training.finetune import Recipe, finetune

    out = common.CACHE / "sst2-classifier-smoke"
    if not (out / "model.safetensors").is_file() or not (out / "eval_results.json").is_file():
        train = common.write_tsv(common.CACHE / "sst2-smoke.tsv", common.sst2_rows(count=64))
        finetune("classify", train, out, recipe=Recipe(epochs=1, show_progress=False))
    return out
