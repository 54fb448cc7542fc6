"""What the benchmark scripts share in a smoke run (``common.SMOKE``, set by ``python -m bench run NAME --smoke``).

A smoke run checks that a benchmark still runs end to end, on a few texts and rows: the scripts shrink their sizes
with ``common.smoke_size`` where they choose them, and with these helpers where several of them shrink alike (a list
cut to its first items, the matmul peak at a small shape) or stand in for what a machine lacks (the CPU for a GPU,
said with ``smoke_training.skip``, as every part a smoke run leaves out is). bench/smoke_training.py holds the tiny
training inputs (a tiny BERT, a few CoNLL sentences and SQuAD questions, the smoke SST-2 classifier).
"""
from __future__ import annotations

from typing import TypeVar

import torch

import common
from common import SMOKE, smoke_size
from smoke_training import skip

T = TypeVar("T")


def few(items: list[T], small: int) -> list[T]:
    """``items``, or its first ``small`` in a smoke run."""
    return items[:smoke_size(len(items), small)]


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

