"""Sequence classification: single texts or pairs, single-label (softmax) or multi-label (sigmoid), and
multi-task models (one prediction per head)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import InputError
from ..modeling.packing import pool_packed
from .pipeline import TaskPipeline, softmax


@dataclass
class ClassPrediction:
    """The predicted label(s) of one text and every label's probability."""

    label: str | list[str]  # single-label: the most probable label; multi-label: every label over the threshold
    score: float  # probability of ``label`` (multi-label: of the most probable label)
    scores: dict[str, float]


def is_multi_label(config) -> bool:
    return config.problem_type == "multi_label_classification"


def predictions_from_logits(logits: np.ndarray, labels: Sequence[str], multi_label: bool,
                            threshold: float = 0.5) -> list[ClassPrediction]:
    if multi_label:
        probabilities = 1.0 / (1.0 + np.exp(-logits))
        chosen = [[labels[i] for i in np.flatnonzero(row >= threshold)] for row in probabilities]
    else:
        probabilities = softmax(logits)
        chosen = [labels[int(i)] for i in probabilities.argmax(axis=1)]
    return [ClassPrediction(label, float(row.max()), {name: float(p) for name, p in zip(labels, row)})
            for label, row in zip(chosen, probabilities)]


class Classifier(TaskPipeline):
    """``Classifier.from_pretrained(dir)(texts, pairs)`` -> one ClassPrediction per text (or, for a
    multi-task model, a dict of them by head)."""

    tasks = ("sequence-classification", "multitask")

    def logits(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> np.ndarray | dict[str, np.ndarray]:
        """Raw scores: (texts, labels), or {head: (texts, labels)} for a multi-task model."""
        return self.logits_and_features(texts, pairs, features=())[0]

    def logits_and_features(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                            features: Sequence[str] = ("cls", "mean")
                            ) -> tuple[np.ndarray | dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Raw scores and, in one pass, encoder features of each text: "cls" (the final [CLS] state),
        "mean" (mean of the final token states), "pooled" (the family's pooler output, where it has one);
        each (texts, hidden) float32. For detectors that work on the classifier's own representation."""
        if isinstance(texts, str):
            raise InputError("pass a list of texts")
        encodings = self.tokenizer.encode_raw(texts, pairs, max_length=self.max_length) if len(texts) else []
        return self.logits_and_features_of_tokens([e.ids for e in encodings], [e.type_ids for e in encodings],
                                                  features=features)

    def logits_and_features_of_tokens(self, ids: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None,
                                      *, features: Sequence[str] = ()
                                      ) -> tuple[np.ndarray | dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``logits_and_features`` of sequences tokenised by the caller (each at most ``max_length`` tokens)."""
        unknown = set(features) - {"cls", "mean", "pooled"}
        if unknown:
            raise InputError(f"unknown features {sorted(unknown)}; choose from cls, mean, pooled")
        pooler = self.model.encoder.pooler
        if "pooled" in features and pooler is None:
            raise InputError(f"{self.config.model_type} has no pooler; use the cls or mean features")
        heads = self.model.heads if self.model.task == "multitask" else {"": self.model.classifier}
        out = {name: np.zeros((len(ids), len(self._labels(name))), dtype=np.float32) for name in heads}
        found = {name: np.zeros((len(ids), self.config.hidden_size), dtype=np.float32) for name in features}
        if len(ids):
            with torch.inference_mode():
                for indices, hidden, batch in self._encode(ids, types):
                    first = batch.first_tokens(hidden)  # [CLS]: (batch, hidden)
                    pooled = pooler(first) if pooler is not None else None
                    for name, head in heads.items():
                        if head.pooling == "late":  # EuroBERT: every token's logits, averaged per sequence
                            logits = pool_packed(head(hidden, pooled), batch, "mean")
                        else:
                            summary = first if head.pooling == "cls" else pool_packed(hidden, batch, head.pooling)
                            logits = head(summary, pooled)
                        out[name][indices] = logits.float().cpu().numpy()
                    if "cls" in found:
                        found["cls"][indices] = first.cpu().numpy()
                    if "pooled" in found:
                        found["pooled"][indices] = pooled.cpu().numpy()
                    if "mean" in found:
                        found["mean"][indices] = pool_packed(hidden, batch, "mean").cpu().numpy()
        return (out[""] if "" in out else out), found

    def _labels(self, head: str) -> list[str]:
        if head:
            return list(self.model.head_specs[head].labels)
        return self.config.labels

    def __call__(self, texts: str | Sequence[str], pairs: str | Sequence[str] | None = None, *,
                 threshold: float = 0.5) -> list[ClassPrediction] | list[dict[str, ClassPrediction]]:
        if isinstance(texts, str):
            texts = [texts]
            pairs = [pairs] if isinstance(pairs, str) else pairs
        logits = self.logits(texts, pairs)
        if isinstance(logits, dict):
            per_head = {name: predictions_from_logits(values, self._labels(name),
                                                      self.model.head_specs[name].multi_label, threshold)
                        for name, values in logits.items()}
            return [{name: per_head[name][row] for name in per_head} for row in range(len(texts))]
        return predictions_from_logits(logits, self.config.labels, is_multi_label(self.config), threshold)
