"""Reranking with a cross-encoder: a one-logit sequence-classification model scores (query, passage) pairs.

``Reranker.from_pretrained(dir).rank(query, passages)`` -> [{"index", "score"[, "text"]}] best first.
Scores are the raw logit by default; ``activation="sigmoid"`` gives what sentence-transformers'
``CrossEncoder.predict`` returns for a one-label model (its default activation there).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import InputError
from .classify import Classifier

ACTIVATIONS = ("none", "sigmoid")


class Reranker(Classifier):
    """A TaskPipeline over a one-logit (num_labels=1) sequence-classification model."""

    tasks = ("sequence-classification",)

    def __init__(self, model, tokenizer, **options) -> None:
        super().__init__(model, tokenizer, **options)
        if self.config.num_labels != 1:
            raise InputError(f"a reranker needs a one-logit model (num_labels=1); this one has "
                             f"{self.config.num_labels} labels ({', '.join(self.config.labels)})")

    def scores(self, query: str, passages: Sequence[str], *, activation: str | None = None) -> np.ndarray:
        """One score per passage (float32): the raw logit, or its sigmoid with ``activation="sigmoid"``."""
        if not isinstance(query, str):
            raise InputError("the query must be one string")
        if isinstance(passages, str):
            raise InputError("pass a list of passages")
        check_activation(activation)
        passages = list(passages)
        if not passages:
            return np.zeros(0, dtype=np.float32)
        unique, inverse, _ = distinct(passages)
        return activate(self.logits([query] * len(unique), unique)[inverse, 0], activation)

    def rank(self, query: str, passages: Sequence[str], top_k: int | None = None, return_text: bool = False, *,
             activation: str | None = None) -> list[dict]:
        """Passages by descending score (ties keep input order): [{"index", "score"[, "text"]}], at most top_k."""
        if top_k is not None and top_k < 1:
            raise InputError(f"top_k must be at least 1, found {top_k}")
        passages = list(passages)
        return ranked(self.scores(query, passages, activation=activation), passages, top_k, return_text)


def distinct(texts: Sequence[str]) -> tuple[list[str], np.ndarray, list[int]]:
    """(the distinct texts in first-seen order, the index of each text among them, each distinct text's first
    position). A cross-encoder scores a text given twice once: no repeated work, and equal texts get bit-equal
    scores, so ties keep input order (one row computed at two places of a packed batch can differ in the last
    bit)."""
    where: dict[str, int] = {}
    first: list[int] = []
    inverse = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        if text not in where:
            where[text] = len(first)
            first.append(i)
        inverse[i] = where[text]
    return list(where), inverse, first


def check_activation(activation: str | None) -> str:
    if (activation or "none") not in ACTIVATIONS:
        raise InputError(f"unknown activation {activation!r}; choose from {', '.join(ACTIVATIONS)}")
    return activation or "none"


def activate(logits: np.ndarray, activation: str | None) -> np.ndarray:
    """The raw logits (activation None or "none"), or their sigmoid (float32 either way)."""
    if check_activation(activation) == "sigmoid":
        return (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
    return logits.astype(np.float32, copy=False)


def ranked(scores: np.ndarray, passages: Sequence[str], top_k: int | None = None,
           return_text: bool = False) -> list[dict]:
    """[{"index", "score"[, "text"]}] by descending score (ties keep input order), at most top_k."""
    rows = []
    for i in np.argsort(-scores, kind="stable")[:top_k]:
        row = {"index": int(i), "score": float(scores[i])}
        if return_text:
            row["text"] = passages[i]
        rows.append(row)
    return rows
