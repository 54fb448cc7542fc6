"""Labelled task data: classification files, CoNLL NER files, SQuAD JSON; seeded validation splits.

Errors name the file, the line and the column of a malformed row.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import DataError, InputError
from .readers import _LineStream, _lines, detect_format, json_objects

_TEXT_COLUMNS = ("text", "sentence", "sentence1", "text_a", "question", "content")
_PAIR_COLUMNS = ("text_pair", "sentence2", "text_b", "hypothesis")
_LABEL_COLUMNS = ("label", "labels", "class", "category")


@dataclass
class ClassificationExample:
    text: str
    pair: str | None
    label: Any  # a label name, or a list of names for multi-label; None in unlabelled data
    line: int = 0  # where it came from (1-based line of the file), for error messages


def read_classification(path: str | Path, *, text_column: str | None = None, pair_column: str | None = None,
                        label_column: str | None = None, has_header: bool = True,
                        multi_label_separator: str | None = None,
                        require_label: bool = True) -> list[ClassificationExample]:
    """CSV/TSV (a header row names the columns, or give the column names / 0-based indices) or JSONL.

    Labels stay as written (names or ids, as strings); a JSON list, or a string split on
    ``multi_label_separator``, makes a multi-label example. ``require_label=False`` reads unlabelled
    data (for prediction): a missing label column gives examples with ``label=None``.
    """
    path = Path(path)
    fmt = detect_format(path)
    examples = []
    if fmt == "jsonl":
        for number, row in json_objects(path):
            text_key = text_column or _first(row, _TEXT_COLUMNS, path, number, "text")
            if require_label:
                label_key = label_column or _first(row, _LABEL_COLUMNS, path, number, "label")
            else:
                label_key = label_column or next((k for k in _LABEL_COLUMNS if k in row), None)
            pair_key = pair_column or next((k for k in _PAIR_COLUMNS if k in row), None)
            for key in (text_key, label_key, pair_column):
                if key is not None and key not in row:
                    raise DataError(f"{path}:{number}: no field {key!r}")
            for key in (text_key, pair_key):
                if key is not None and not isinstance(row[key], str):
                    raise DataError(f"{path}:{number}: field {key!r} must be a string, found "
                                    f"{type(row[key]).__name__}")
            label = None if label_key is None else _label(row[label_key], multi_label_separator, path, number)
            examples.append(ClassificationExample(row[text_key], None if pair_key is None else row[pair_key], label,
                                                  number))
    else:
        delimiter = "\t" if fmt == "tsv" or path.suffix.lower() == ".tsv" else ","
        reader = csv.reader(_LineStream(_lines(path)), delimiter=delimiter, quoting=csv.QUOTE_MINIMAL)
        header = next(reader, None) if has_header else None
        if has_header and header is None:
            raise DataError(f"{path} is empty")
        header = [h.strip() for h in header] if header else None

        def column(name: str | None, candidates: Sequence[str], what: str, required: bool) -> int | None:
            if name is not None and name.isdigit():
                return int(name)
            if header is None:
                if required:
                    raise InputError(f"{path} has no header: give the {what} column as a 0-based index")
                return None
            if name is not None:
                if name not in header:
                    raise DataError(f"{path}:1: no column {name!r} among {header}")
                return header.index(name)
            found = next((header.index(c) for c in candidates if c in header), None)
            if found is None and required:
                raise DataError(f"{path}:1: no {what} column among {header}; name it with --{what}-column")
            return found

        text_index = column(text_column, _TEXT_COLUMNS, "text", True)
        label_index = column(label_column, _LABEL_COLUMNS, "label", require_label)
        pair_index = column(pair_column, _PAIR_COLUMNS, "pair", False)
        for row in reader:
            if not row or not any(cell.strip() for cell in row):
                continue
            needed = max(i for i in (text_index, label_index, pair_index) if i is not None)
            if len(row) <= needed:
                raise DataError(f"{path}:{reader.line_num}: {len(row)} column(s), expected at least {needed + 1}")
            label = None
            if label_index is not None:
                if not row[label_index].strip():
                    raise DataError(f"{path}:{reader.line_num}: the label column ({label_index + 1}) is empty")
                label = _label(row[label_index].strip(), multi_label_separator, path, reader.line_num)
            examples.append(ClassificationExample(
                row[text_index].strip(), None if pair_index is None else row[pair_index].strip(), label,
                reader.line_num))
    if not examples:
        raise DataError(f"{path} holds no examples")
    return examples


def _first(row: dict, keys: Sequence[str], path: Path, number: int, what: str) -> str:
    key = next((k for k in keys if k in row), None)
    if key is None:
        raise DataError(f"{path}:{number}: no {what} field (looked for {', '.join(keys)})")
    return key


def _label(value: Any, separator: str | None, path: Path, line: int) -> Any:
    if isinstance(value, list):
        if not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
            raise DataError(f"{path}:{line}: a label list must hold names or integer ids, found {value!r}")
        return [str(v) for v in value]
    if value is None or isinstance(value, (bool, dict, float)):
        raise DataError(f"{path}:{line}: a label must be a name or an integer id, found {value!r}")
    if separator and isinstance(value, str):
        return [part.strip() for part in value.split(separator) if part.strip()]
    return str(value)


@dataclass
class TaggedSentence:
    tokens: list[str]
    tags: list[str]
    document: int = 0
    line: int = 0  # 1-based line of the sentence's first token, for error messages


def read_conll(path: str | Path, *, tag_column: int = -1) -> list[TaggedSentence]:
    """CoNLL-2003-style files: one token per line (token first, tag in ``tag_column``), blank lines
    between sentences, -DOCSTART- lines between documents (skipped, wherever they are)."""
    path = Path(path)
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    document = first_line = 0
    for number, line in _lines(path):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if tokens:
                sentences.append(TaggedSentence(tokens, tags, document, first_line))
                tokens, tags = [], []
            if fields:
                document += 1
            continue
        if len(fields) < 2:
            raise DataError(f"{path}:{number}: expected a token and a tag, found {line!r}")
        tag = fields[tag_column]
        if tag != "O" and not (len(tag) > 2 and tag[1] == "-" and tag[0] in "BIES"):
            raise DataError(f"{path}:{number}: column {len(fields) + tag_column + 1 if tag_column < 0 else tag_column + 1}"
                            f" holds {tag!r}, not an IOB tag (O, B-X, I-X, E-X, S-X)")
        if not tokens:
            first_line = number
        tokens.append(fields[0])
        tags.append(tag)
    if tokens:
        sentences.append(TaggedSentence(tokens, tags, document, first_line))
    if not sentences:
        raise DataError(f"{path} holds no sentences")
    return sentences


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (B- only between neighbouring entities) -> IOB2 (every entity starts with B-)."""
    out, previous = [], "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
        previous = tag
    return out


@dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list[str]
    answer_starts: list[int]
    title: str = ""
    extra: dict = field(default_factory=dict)


def read_squad(path: str | Path) -> list[QAExample]:
    """SQuAD v1.1 JSON: data[] -> paragraphs[] -> qas[] -> answers[] (answer_start, text), checked."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"SQuAD file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError(f"{path}: expected {{\"data\": [...]}} (SQuAD format)")
    examples = []
    for article in data["data"]:
        for paragraph in article.get("paragraphs", []):
            context = paragraph["context"]
            for qa in paragraph.get("qas", []):
                answers = qa.get("answers", [])
                for answer in answers:
                    start = answer["answer_start"]
                    if context[start:start + len(answer["text"])] != answer["text"]:
                        raise DataError(f"{path}: question {qa['id']}: answer {answer['text']!r} is not at "
                                        f"character {start} of its context")
                examples.append(QAExample(qa["id"], qa["question"], context, [a["text"] for a in answers],
                                          [a["answer_start"] for a in answers], article.get("title", "")))
    if not examples:
        raise DataError(f"{path} holds no questions")
    return examples


def split_validation(items: Sequence[Any], fraction: float = 0.1, seed: int = 0,
                     groups: Sequence[Any] | None = None) -> tuple[list[Any], list[Any]]:
    """A seeded (train, validation) split; with ``groups`` (e.g. articles or documents) whole groups move."""
    if not 0 < fraction < 1:
        raise InputError(f"validation fraction must be in (0, 1), found {fraction}")
    rng = np.random.default_rng(seed)
    if groups is None:
        order = rng.permutation(len(items))
        cut = max(1, int(round(fraction * len(items))))
        valid = set(order[:cut].tolist())
    else:
        names = list(dict.fromkeys(groups))
        chosen = rng.permutation(len(names))[:max(1, int(round(fraction * len(names))))]
        picked = {names[i] for i in chosen}
        valid = {i for i, g in enumerate(groups) if g in picked}
    return ([x for i, x in enumerate(items) if i not in valid], [x for i, x in enumerate(items) if i in valid])
