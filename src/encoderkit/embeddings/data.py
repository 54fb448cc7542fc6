"""Training files for sentence embedders: TSV/CSV (a header line naming the columns) or JSONL (the keys).

Three shapes, told apart by their columns or chosen by the loss:

- ``anchor-positive``: ``anchor, positive`` and any number of hard-negative columns, for ``mnrl``,
  ``cached-mnrl`` and ``triplet`` (which needs at least one). A negative column is named ``negative``
  or ``negative_<n>`` (``negative_1``, ``negative_2``, ...); they are read in that order: ``negative``
  first, then by ``n``.
- ``scored-pair``: ``sentence1, sentence2, score`` (a float), for ``cosine`` (score in [0, 1]) and
  ``cosent`` (any finite real).
- ``labelled-pair``: ``premise, hypothesis, label`` (a string), for ``softmax``. Labels become ids
  0..n-1 in sorted order of the names in the training file; a validation file read with that map
  must not hold other labels.

Other columns are ignored (with a warning naming them). Every malformed input raises a ``DataError``
naming the file, the line and what to do. ``NoDuplicatesBatcher`` makes MNRL batches in which no
text appears twice where the data allow it.
"""
from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence, Union

import numpy as np

from ..data.readers import _LineStream, _lines, detect_format, json_objects
from ..errors import DataError, InputError

log = logging.getLogger(__name__)

ANCHOR_POSITIVE = "anchor-positive"
SCORED_PAIR = "scored-pair"
LABELLED_PAIR = "labelled-pair"
SHAPES = (ANCHOR_POSITIVE, SCORED_PAIR, LABELLED_PAIR)
SHAPE_COLUMNS = {
    ANCHOR_POSITIVE: ("anchor", "positive"),
    SCORED_PAIR: ("sentence1", "sentence2", "score"),
    LABELLED_PAIR: ("premise", "hypothesis", "label"),
}
SHAPE_HELP = {
    ANCHOR_POSITIVE: "anchor, positive[, negative, negative_1, negative_2, ...]",
    SCORED_PAIR: "sentence1, sentence2, score",
    LABELLED_PAIR: "premise, hypothesis, label",
}
LOSS_SHAPES = {"mnrl": ANCHOR_POSITIVE, "cached-mnrl": ANCHOR_POSITIVE, "triplet": ANCHOR_POSITIVE,
               "splade": ANCHOR_POSITIVE, "maxsim": ANCHOR_POSITIVE, "cosine": SCORED_PAIR, "cosent": SCORED_PAIR, "softmax": LABELLED_PAIR}
# (low, high) inclusive score range per loss; None: any finite real
SCORE_RANGES: dict[str, tuple[float, float] | None] = {"cosine": (0.0, 1.0), "cosent": None}
_NEGATIVE = re.compile(r"^negative(?:_(\d+))?$")
_FORMATS = ("tsv", "csv", "jsonl")


@dataclass(frozen=True)
class AnchorPositive:
    anchor: str
    positive: str
    negatives: tuple[str, ...] = ()

    @property
    def texts(self) -> tuple[str, ...]:
        return (self.anchor, self.positive, *self.negatives)


@dataclass(frozen=True)
class ScoredPair:
    sentence1: str
    sentence2: str
    score: float

    @property
    def texts(self) -> tuple[str, ...]:
        return (self.sentence1, self.sentence2)


@dataclass(frozen=True)
class LabelledPair:
    premise: str
    hypothesis: str
    label: int  # an id of TrainingData.labels

    @property
    def texts(self) -> tuple[str, ...]:
        return (self.premise, self.hypothesis)


Example = Union[AnchorPositive, ScoredPair, LabelledPair]


@dataclass
class TrainingData:
    path: Path
    shape: str
    examples: list[Example]
    negative_columns: tuple[str, ...] = ()
    labels: dict[str, int] | None = None  # label name -> id (labelled pairs only)

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def label_names(self) -> list[str]:
        """Label names in id order (labelled pairs only)."""
        return sorted(self.labels, key=self.labels.__getitem__) if self.labels else []


def negative_columns(columns: Sequence[str]) -> tuple[str, ...]:
    """The hard-negative columns among ``columns``, in reading order: ``negative``, then ``negative_<n>`` by n."""
    found = [(c, _NEGATIVE.match(c)) for c in columns]
    return tuple(c for c, m in sorted(((c, m) for c, m in found if m),
                                      key=lambda cm: -1 if cm[1].group(1) is None else int(cm[1].group(1))))


def detect_shape(columns: Sequence[str], *, loss: str | None = None, where: str = "") -> str:
    """The shape of a file from its columns, or the one ``loss`` needs (checking that the columns are there)."""
    prefix = f"{where}: " if where else ""
    present = set(columns)
    if loss is not None:
        if loss not in LOSS_SHAPES:
            raise InputError(f"unknown loss {loss!r}; choose one of {', '.join(LOSS_SHAPES)}")
        shape = LOSS_SHAPES[loss]
        missing = [c for c in SHAPE_COLUMNS[shape] if c not in present]
        if missing:
            raise DataError(f"{prefix}missing column(s) {', '.join(missing)}: the {loss} loss needs the columns "
                            f"{SHAPE_HELP[shape]}; found {', '.join(columns) or 'none'} (a TSV/CSV file must start "
                            "with a header line naming them)")
        if loss == "triplet" and not negative_columns(columns):
            raise DataError(f"{prefix}the triplet loss needs a negative column (negative or negative_1, ...) beside "
                            f"anchor and positive; found {', '.join(columns)}. Add one (encoderkit mine-negatives "
                            "writes them) or use --loss mnrl")
        return shape
    for shape in SHAPES:
        if all(c in present for c in SHAPE_COLUMNS[shape]):
            return shape
    expected = "; or ".join(SHAPE_HELP[s] for s in SHAPES)
    raise DataError(f"{prefix}the columns {', '.join(columns) or '(none)'} match no training shape; expected "
                    f"{expected} (a TSV/CSV file must start with a header line naming them)")


def training_format(path: Path, fmt: str | None = None) -> str:
    fmt = fmt or detect_format(path)
    if fmt not in _FORMATS:
        raise DataError(f"{path}: training files are .tsv, .csv or .jsonl (with named columns); "
                        f"rename the file or give its format")
    return fmt


def table_rows(path: Path, fmt: str) -> Iterator[tuple[int, dict]]:
    """(line number, {column: value}) for each record; the first item is (1, header-as-dict) for TSV/CSV."""
    if fmt == "jsonl":
        yield from json_objects(path)
        return
    reader = csv.reader(_LineStream(_lines(path)), delimiter="," if fmt == "csv" else "\t")
    header = None
    for row in reader:
        if header is None:
            if not row or not any(cell.strip() for cell in row):
                continue
            header = [cell.strip() for cell in row]
            yield reader.line_num, {name: name for name in header}
            continue
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != len(header):
            raise DataError(f"{path}:{reader.line_num}: {len(row)} column(s), the header has {len(header)} "
                            f"({', '.join(header)}); check the separators ({'comma' if fmt == 'csv' else 'tab'}) "
                            "and the quoting")
        yield reader.line_num, dict(zip(header, row))


def column_text(path: Path, number: int, obj: Mapping, column: str) -> str:
    if column not in obj:
        raise DataError(f"{path}:{number}: no {column!r} field; every line needs the same columns as the first")
    value = obj[column]
    if not isinstance(value, str):
        raise DataError(f"{path}:{number}: {column!r} must be a string, found {type(value).__name__}")
    if not value.strip():
        raise DataError(f"{path}:{number}: empty text in column {column!r}; fill it in or remove the line")
    return value


def _score(path: Path, number: int, raw: object, loss: str | None) -> float:
    try:
        if isinstance(raw, bool):
            raise ValueError
        score = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise DataError(f"{path}:{number}: score {raw!r} is not a number; give a float such as 0.8") from None
    if not math.isfinite(score):
        raise DataError(f"{path}:{number}: score {raw!r} is not finite; give a real number")
    bounds = SCORE_RANGES.get(loss) if loss else None
    if bounds is not None and not bounds[0] <= score <= bounds[1]:
        raise DataError(f"{path}:{number}: score {score:g} lies outside [{bounds[0]:g}, {bounds[1]:g}], the range of "
                        f"the {loss} loss (CoSENT takes any real score); rescale the scores (e.g. STS-B's 0-5 "
                        "divided by 5) or use --loss cosent")
    return score


def read_training_file(path: str | Path, *, loss: str | None = None, shape: str | None = None,
                       labels: Mapping[str, int] | None = None, fmt: str | None = None) -> TrainingData:
    """Read a training (or validation) file into typed examples.

    ``loss`` picks the shape and checks scores against its range; ``shape`` picks the shape without a loss;
    otherwise it is detected from the columns. ``labels``: the label map of the training file, for a
    validation file (a label not in it raises); without it the map is built from this file's labels.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"training file {path} does not exist")
    fmt = training_format(path, fmt)
    if shape is not None and shape not in SHAPES:
        raise InputError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    rows = table_rows(path, fmt)
    first = next(rows, None)
    if first is None:
        raise DataError(f"{path} is empty; give a header line ({'; or '.join(SHAPE_HELP.values())}) and examples")
    header_line, first_obj = first
    columns = list(first_obj)
    where = f"{path}:{header_line}"
    if shape is not None and loss is None:
        missing = [c for c in SHAPE_COLUMNS[shape] if c not in first_obj]
        if missing:
            raise DataError(f"{where}: missing column(s) {', '.join(missing)}; expected {SHAPE_HELP[shape]}, found "
                            f"{', '.join(columns)} (a TSV/CSV file must start with a header line naming them)")
    else:
        shape = detect_shape(columns, loss=loss, where=where)
    negatives = negative_columns(columns) if shape == ANCHOR_POSITIVE else ()
    used = set(SHAPE_COLUMNS[shape]) | set(negatives)
    ignored = [c for c in columns if c not in used]
    if ignored:
        log.warning("%s: column(s) %s ignored (a %s file uses %s)", path, ", ".join(ignored), shape, SHAPE_HELP[shape])
    records = itertools.chain([first], rows) if fmt == "jsonl" else rows  # TSV/CSV: the first item is the header
    examples: list[Example] = []
    raw_labels: list[tuple[int, str]] = []
    for number, obj in records:
        if shape == ANCHOR_POSITIVE:
            examples.append(AnchorPositive(column_text(path, number, obj, "anchor"), column_text(path, number, obj, "positive"),
                                           tuple(column_text(path, number, obj, c) for c in negatives)))
        elif shape == SCORED_PAIR:
            if "score" not in obj:
                raise DataError(f"{path}:{number}: no 'score' field; every line needs {SHAPE_HELP[shape]}")
            examples.append(ScoredPair(column_text(path, number, obj, "sentence1"), column_text(path, number, obj, "sentence2"),
                                       _score(path, number, obj["score"], loss)))
        else:
            if "label" not in obj or obj["label"] is None or not str(obj["label"]).strip():
                raise DataError(f"{path}:{number}: no label; every line needs {SHAPE_HELP[shape]}")
            label = str(obj["label"]).strip()
            if labels is not None and label not in labels:
                raise DataError(f"{path}:{number}: label {label!r} was never seen in training (known: "
                                f"{', '.join(sorted(labels))}); fix the label or add examples of it to the training "
                                "file")
            raw_labels.append((number, label))
            examples.append(LabelledPair(column_text(path, number, obj, "premise"), column_text(path, number, obj, "hypothesis"),
                                         -1))
    if not examples:
        raise DataError(f"{path} holds a header but no examples; add lines of {SHAPE_HELP[shape]}")
    label_map = None
    if shape == LABELLED_PAIR:
        label_map = dict(labels) if labels is not None else {
            name: i for i, name in enumerate(sorted({name for _, name in raw_labels}))}
        examples = [LabelledPair(e.premise, e.hypothesis, label_map[name])  # type: ignore[union-attr]
                    for e, (_, name) in zip(examples, raw_labels)]
    return TrainingData(path, shape, examples, negatives, label_map)


def write_training_file(path: str | Path, examples: Sequence[AnchorPositive], *, fmt: str | None = None) -> Path:
    """Write anchor/positive(/negative_1..n) examples as TSV/CSV (with a header) or JSONL, by the extension.
    All examples must have the same number of negatives."""
    path = Path(path)
    fmt = training_format(path, fmt)
    count = len(examples[0].negatives) if examples else 0
    if any(len(e.negatives) != count for e in examples):
        raise InputError("every example must have the same number of negatives to be written as columns")
    columns = ["anchor", "positive", *(f"negative_{i}" for i in range(1, count + 1))]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        if fmt == "jsonl":
            for e in examples:
                handle.write(json.dumps(dict(zip(columns, e.texts)), ensure_ascii=False) + "\n")
        else:
            writer = csv.writer(handle, delimiter="," if fmt == "csv" else "\t", lineterminator="\n")
            writer.writerow(columns)
            for e in examples:
                writer.writerow(e.texts)
    return path


@dataclass
class NoDuplicatesBatcher:
    """Batches of example indices in which no text repeats (across all text columns) where the data allow it.

    Each epoch shuffles the examples (seeded by ``seed`` and the epoch), then fills each batch with the first
    remaining examples none of whose texts are already in the batch; conflicting examples wait for a later
    batch, so every example is used exactly once per epoch. When only conflicting examples remain, the batch
    is yielded short (``fill=False``, as sentence-transformers' NoDuplicatesBatchSampler) or topped up with
    them in shuffled order (``fill=True``: full batches, the duplicates then masked by the loss's
    ``duplicates`` argument). ``drop_last`` drops a final batch that is not full.
    """

    examples: Sequence[Example | Sequence[str]]
    batch_size: int
    seed: int = 0
    drop_last: bool = False
    fill: bool = False
    epoch: int = 0
    _texts: list[frozenset[str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise InputError(f"batch_size must be positive, found {self.batch_size}")
        self._texts = [frozenset(e.texts if hasattr(e, "texts") else e) for e in self.examples]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self, epoch: int | None = None) -> list[list[int]]:
        epoch = self.epoch if epoch is None else epoch
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self._texts)).tolist()
        batches: list[list[int]] = []
        remaining = order
        while remaining:
            batch: list[int] = []
            seen: set[str] = set()
            deferred: list[int] = []
            for position, index in enumerate(remaining):
                if len(batch) == self.batch_size:
                    deferred.extend(remaining[position:])
                    break
                if seen.isdisjoint(self._texts[index]):
                    batch.append(index)
                    seen.update(self._texts[index])
                else:
                    deferred.append(index)
            if self.fill and len(batch) < self.batch_size and deferred:
                take = self.batch_size - len(batch)
                batch.extend(deferred[:take])
                deferred = deferred[take:]
            remaining = deferred
            if len(batch) == self.batch_size or not self.drop_last:
                batches.append(batch)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        """Exact with ``fill=True``; otherwise the batches of a set without duplicates (short batches add more)."""
        n = len(self._texts)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
