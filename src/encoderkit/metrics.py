"""Task metrics with their standard definitions.

- accuracy, per-class and macro F1 (scikit-learn's definitions, zero_division=0), micro-F1 for
  multi-label indicator matrices;
- entity-level precision/recall/F1 with exact span matching, chunks read as conlleval and
  seqeval's default mode read them (IOB1, IOB2/BIO, IOE and IOBES tags);
- SQuAD v1.1 exact match and F1 with the official answer normalisation.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Sequence

import numpy as np

from .errors import InputError


def accuracy(y_true: Sequence, y_pred: Sequence) -> float:
    y_true, y_pred = _pair(y_true, y_pred)
    return float(np.mean(y_true == y_pred)) if len(y_true) else 0.0


def f1_per_class(y_true: Sequence, y_pred: Sequence) -> dict:
    y_true, y_pred = _pair(y_true, y_pred)
    scores = {}
    for label in sorted(set(y_true.tolist()) | set(y_pred.tolist()), key=str):
        tp = int(np.sum((y_true == label) & (y_pred == label)))
        fp = int(np.sum((y_true != label) & (y_pred == label)))
        fn = int(np.sum((y_true == label) & (y_pred != label)))
        scores[label] = _f1(tp, fp, fn)
    return scores


def macro_f1(y_true: Sequence, y_pred: Sequence) -> float:
    scores = f1_per_class(y_true, y_pred)
    return float(np.mean(list(scores.values()))) if scores else 0.0


def micro_f1_multilabel(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Micro-averaged F1 of (examples, labels) 0/1 indicator matrices."""
    y_true, y_pred = np.asarray(y_true).astype(bool), np.asarray(y_pred).astype(bool)
    if y_true.shape != y_pred.shape:
        raise InputError(f"indicator matrices differ in shape: {y_true.shape} vs {y_pred.shape}")
    tp = int((y_true & y_pred).sum())
    return _f1(tp, int((~y_true & y_pred).sum()), int((y_true & ~y_pred).sum()))


def binary_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """F1 of one label's 0/1 indicators (0 when the label is neither present nor predicted)."""
    y_true, y_pred = np.asarray(y_true).astype(bool), np.asarray(y_pred).astype(bool)
    return _f1(int((y_true & y_pred).sum()), int((~y_true & y_pred).sum()), int((y_true & ~y_pred).sum()))


def _pair(y_true: Sequence, y_pred: Sequence) -> tuple[np.ndarray, np.ndarray]:
    if len(y_true) != len(y_pred):
        raise InputError(f"{len(y_true)} references but {len(y_pred)} predictions")
    return np.asarray(list(y_true), dtype=object), np.asarray(list(y_pred), dtype=object)


def _f1(tp: int, fp: int, fn: int) -> float:
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


# ---------------------------------------------------------------------------------------------
# Entities (conlleval / seqeval default mode)
# ---------------------------------------------------------------------------------------------
def _split(tag: str) -> tuple[str, str]:
    if tag in ("O", "", None):
        return "O", ""
    if len(tag) > 1 and tag[1] in "-_" and tag[0] in "BIESLU":
        return tag[0], tag[2:]
    return "I", tag  # a bare type counts as inside, as conlleval reads it


def _ends(prev_prefix: str, prefix: str, prev_type: str, kind: str) -> bool:
    return (prev_prefix in ("E", "S", "L", "U")
            or (prev_prefix in ("B", "I") and prefix in ("B", "S", "O", "U"))
            or (prev_prefix != "O" and prev_type != kind))


def _starts(prev_prefix: str, prefix: str, prev_type: str, kind: str) -> bool:
    return (prefix in ("B", "S", "U")
            or (prev_prefix in ("E", "S", "L", "U", "O") and prefix in ("I", "E", "L"))
            or (prefix != "O" and prev_type != kind))


def entities(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """(type, first token, last token) of every chunk in one sentence's tags."""
    chunks, start, kind = set(), None, ""
    prev_prefix, prev_type = "O", ""
    for position, tag in enumerate(list(tags) + ["O"]):
        prefix, tag_type = _split(tag)
        if start is not None and _ends(prev_prefix, prefix, prev_type, tag_type):
            chunks.add((kind, start, position - 1))
            start = None
        if prefix != "O" and _starts(prev_prefix, prefix, prev_type, tag_type):
            start, kind = position, tag_type
        prev_prefix, prev_type = prefix, tag_type
    return chunks


def entity_scores(y_true: Iterable[Sequence[str]], y_pred: Iterable[Sequence[str]]) -> dict[str, float]:
    """Micro precision / recall / F1 over exactly matching entity spans (and per type)."""
    gold_total = pred_total = correct = 0
    per_type: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])  # correct, gold, predicted
    for sentence, (gold_tags, pred_tags) in enumerate(zip(y_true, y_pred)):
        if len(gold_tags) != len(pred_tags):
            raise InputError(f"sentence {sentence}: {len(gold_tags)} gold tags but {len(pred_tags)} predicted")
        gold, pred = entities(gold_tags), entities(pred_tags)
        gold_total += len(gold)
        pred_total += len(pred)
        correct += len(gold & pred)
        for kind, *_ in gold:
            per_type[kind][1] += 1
        for kind, *_ in pred:
            per_type[kind][2] += 1
        for kind, *_ in gold & pred:
            per_type[kind][0] += 1
    precision = correct / pred_total if pred_total else 0.0
    recall = correct / gold_total if gold_total else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    result = {"precision": precision, "recall": recall, "f1": f1}
    for kind, (hits, gold_count, pred_count) in sorted(per_type.items()):
        result[f"{kind}_f1"] = 2 * hits / (gold_count + pred_count) if hits else 0.0
    return result


# ---------------------------------------------------------------------------------------------
# SQuAD v1.1 (the official evaluation's definitions)
# ---------------------------------------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_exact_match(prediction: str, truths: Sequence[str]) -> float:
    return float(max(normalize_answer(prediction) == normalize_answer(t) for t in truths))


def squad_f1(prediction: str, truths: Sequence[str]) -> float:
    def single(truth: str) -> float:
        predicted, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
        common = collections.Counter(predicted) & collections.Counter(gold)
        overlap = sum(common.values())
        if overlap == 0:
            return 0.0
        precision, recall = overlap / len(predicted), overlap / len(gold)
        return 2 * precision * recall / (precision + recall)

    return max(single(t) for t in truths)


def squad_scores(predictions: dict[str, str], references: dict[str, Sequence[str]]) -> dict[str, float]:
    """Exact match and F1 in percent over the questions of ``references`` (missing answers score 0)."""
    if not references:
        raise InputError("no reference answers")
    em = f1 = 0.0
    for question, truths in references.items():
        if question in predictions:
            em += squad_exact_match(predictions[question], truths)
            f1 += squad_f1(predictions[question], truths)
    return {"exact_match": 100.0 * em / len(references), "f1": 100.0 * f1 / len(references)}
