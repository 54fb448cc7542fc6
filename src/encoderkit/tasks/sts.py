"""STS evaluation: Spearman and Pearson correlation of cosine similarity with gold scores."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.readers import read_sts
from ..errors import DataError


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    if denominator == 0:
        raise DataError("correlation is undefined: one of the score lists is constant")
    return float((x * y).sum() / denominator)


def rank(values: np.ndarray) -> np.ndarray:
    """1-based ranks; tied values share the mean of their ranks (as scipy.stats.rankdata 'average')."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_values = values[order]
    boundaries = np.flatnonzero(np.diff(sorted_values)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(values)]])
    for start, end in zip(starts, ends):
        ranks[order[start:end]] = (start + end + 1) / 2.0
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(rank(x), rank(y))


@dataclass
class STSResult:
    spearman: float
    pearson: float
    pairs: int


def evaluate_sts(path: str | Path, embedder) -> STSResult:
    """Cosine similarity of each pair's embeddings against the gold scores of an STS-B-format file."""
    pairs = read_sts(path)
    first = embedder.encode([p.sentence1 for p in pairs], normalize=True)
    second = embedder.encode([p.sentence2 for p in pairs], normalize=True)
    cosine = (first.astype(np.float64) * second.astype(np.float64)).sum(axis=1)
    gold = np.array([p.score for p in pairs])
    return STSResult(spearman(gold, cosine), pearson(gold, cosine), len(pairs))
