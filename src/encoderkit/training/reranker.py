"""Cross-encoder (reranker) training: ``query, passage, label`` rows (label 0/1 or a float in [0, 1]),
binary cross-entropy on one logit, with finetune's recipe, Trainer and output format.

Optionally ``negatives=N`` with an ``embedder`` adds N hard negatives per positive (label >= 0.5), mined
with ``encoderkit.embeddings.mining.mine_hard_negatives`` from the file's passages, each with label 0.
The output is a one-logit sequence-classification directory (num_labels=1, problem_type
multi_label_classification, i.e. BCE) that transformers' AutoModelForSequenceClassification and
sentence-transformers' CrossEncoder load; CrossEncoder's default activation for one label is the sigmoid.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..data.tasks import ClassificationExample
from ..embeddings.data import column_text, table_rows, training_format
from ..errors import DataError, InputError
from ..tokenizer import Tokenizer
from .finetune import FinetuneResult, Recipe, TaskKind, _finetune

log = logging.getLogger(__name__)

COLUMNS = ("query", "passage", "label")


def read_rerank_file(path: str | Path) -> list[ClassificationExample]:
    """``query, passage, label`` rows of a TSV/CSV (with a header) or JSONL file; label a float in [0, 1]."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"training file {path} does not exist")
    fmt = training_format(path)
    rows = table_rows(path, fmt)
    first = next(rows, None)
    if first is None:
        raise DataError(f"{path} is empty; give a header line (query, passage, label) and examples")
    line, header = first
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise DataError(f"{path}:{line}: missing column(s) {', '.join(missing)}; a reranker file has query, passage, "
                        f"label (found {', '.join(header)})")
    records = [first, *rows] if fmt == "jsonl" else list(rows)
    examples = []
    for number, obj in records:
        raw = obj.get("label")
        try:
            if isinstance(raw, bool) or raw is None:
                raise ValueError
            label = float(raw)
        except (TypeError, ValueError):
            raise DataError(f"{path}:{number}: label {raw!r} is not a number; give 0, 1 or a float in [0, 1]") from None
        if not 0.0 <= label <= 1.0:  # also rejects NaN
            raise DataError(f"{path}:{number}: label {label:g} lies outside [0, 1]; a reranker's labels are 0/1 or "
                            "relevance probabilities")
        examples.append(ClassificationExample(column_text(path, number, obj, "query"), column_text(path, number, obj, "passage"),
                                              label, number))
    if not examples:
        raise DataError(f"{path} holds a header but no examples; add query, passage, label lines")
    return examples


def add_mined_negatives(examples: list[ClassificationExample], embedder: Any, num_negatives: int,
                        **mining: Any) -> list[ClassificationExample]:
    """``examples`` plus ``num_negatives`` mined negatives (label 0) per positive (label >= 0.5), mined from
    the examples' passages."""
    from ..embeddings.mining import mine_hard_negatives

    positives = [e for e in examples if e.label >= 0.5]
    if not positives:
        raise DataError("no positive (label >= 0.5) rows to mine negatives for")
    corpus = list(dict.fromkeys(e.pair for e in examples))
    mined = mine_hard_negatives(embedder, [e.text for e in positives], [e.pair for e in positives], corpus,
                                num_negatives=num_negatives, **mining)
    log.info("%s", mined.summary(num_negatives))
    added = [ClassificationExample(m.anchor, negative, 0.0, 0) for m in mined.examples for negative in m.negatives]
    return examples + added


class RerankKind(TaskKind):
    """Text pairs with one float target, BCE on one logit; the main metric is the validation BCE (lower is better)."""

    name = "rerank"
    model_task = "sequence-classification"
    main_metric = "bce"
    greater_is_better = False

    def __init__(self, *, embedder: Any = None, negatives: int | None = None, mining: dict | None = None) -> None:
        super().__init__()
        self.embedder, self.negatives, self.mining = embedder, negatives, mining or {}
        self._mined_once = False

    def summary(self) -> dict[str, Any]:
        return {"mined_negatives": self.negatives}

    def read(self, path: Any, *, labelled: bool = True) -> list[ClassificationExample]:
        examples = read_rerank_file(path)
        if self.negatives and not self._mined_once:  # the training file (read first), not a validation file
            self._mined_once = True
            examples = add_mined_negatives(examples, self.embedder, self.negatives, **self.mining)
        return examples

    def split(self, examples, fraction, seed):
        from ..data.tasks import split_validation

        return split_validation(examples, fraction, seed, groups=[e.text for e in examples])  # whole queries

    def configure(self, config, labels):
        config = config.with_labels(["LABEL_0"])
        config.problem_type = "multi_label_classification"  # BCE with logits, here and in transformers
        return config

    def features(self, tokenizer: Tokenizer, examples, labels, recipe, training) -> list[dict]:
        encodings = tokenizer.encode_raw([e.text for e in examples], [e.pair for e in examples],
                                         max_length=recipe.max_length)
        return [{"input_ids": enc.ids, "token_type_ids": enc.type_ids, "labels": [float(e.label)], "example": i}
                for i, (e, enc) in enumerate(zip(examples, encodings))]

    def pipeline(self, model, tokenizer, dtype):
        from ..tasks.rerank import Reranker

        return Reranker(model, tokenizer, dtype=dtype, show_progress=False)

    def evaluate(self, pipeline, examples) -> dict[str, float]:
        logits = pipeline.logits([e.text for e in examples], [e.pair for e in examples])[:, 0].astype(np.float64)
        return rerank_metrics(logits, np.array([e.label for e in examples], dtype=np.float64))


def rerank_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Mean BCE with logits (numerically stable) and accuracy (logit > 0 against label >= 0.5)."""
    bce = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    accuracy = np.mean((logits > 0) == (labels >= 0.5))
    return {"bce": float(bce.mean()), "accuracy": float(accuracy), "examples": float(len(labels))}


def train_reranker(model_dir: str | Path | None, train_file: str | Path, out_dir: str | Path, *, epochs: float = 1,
                   batch_size: int = 16, learning_rate: float = 2e-5, negatives: int | None = None,
                   embedder: Any = None, valid_file: str | Path | None = None, max_length: int | None = None,
                   seed: int = 42, resume: bool = True, show_progress: bool = True,
                   mining: dict | None = None, **recipe: Any) -> FinetuneResult:
    """Train a cross-encoder reranker from ``model_dir`` (an encoder or a cross-encoder) and save it to ``out_dir``.

    ``negatives``: hard negatives mined per positive with ``embedder`` (an ``encoderkit.Embedder`` or a path to an
    embedding model); ``mining``: mine_hard_negatives options (margin, range_min, range_max). ``recipe``: further
    ``Recipe`` fields (warmup_ratio, weight_decay, valid_fraction, ...).
    """
    if negatives is not None:
        if negatives < 1:
            raise InputError(f"--mine-negatives must be at least 1, found {negatives}")
        if embedder is None:
            raise InputError("mining negatives needs an embedding model (--embedder DIR)")
        if isinstance(embedder, (str, Path)):
            from ..tasks.embed import Embedder

            embedder = Embedder.from_pretrained(embedder)
    kind = RerankKind(embedder=embedder, negatives=negatives, mining=mining)
    settings = Recipe(epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, max_length=max_length,
                      seed=seed, show_progress=show_progress, **recipe)
    return _finetune(kind, train_file, Path(out_dir), valid=valid_file, model=model_dir, recipe=settings,
                     resume=resume)
