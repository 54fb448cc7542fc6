"""Reading text records from files, streamed: plain text (one per line), JSONL, CSV/TSV, STS-B.

Undecodable bytes never stop a run: they become U+FFFD and one warning names the file and count.
Malformed rows raise a DataError naming the file and line.
"""
from __future__ import annotations

import csv
import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import DataError

log = logging.getLogger(__name__)

FORMATS = ("text", "jsonl", "csv", "tsv")
TEXT_KEYS = ("text", "sentence", "content", "body", "document")


@dataclass(frozen=True)
class Record:
    id: str
    text: str


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower()
    return {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}.get(suffix, "text")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line without its line break), read in binary and decoded per line."""
    if not path.is_file():
        raise DataError(f"input file not found: {path}")
    bad = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                bad += 1
                line = raw.decode("utf-8", errors="replace")
            yield number, line.rstrip("\r\n")
    if bad:
        log.warning("%s: %d line(s) held bytes that are not UTF-8; they were replaced by U+FFFD", path, bad)


def read_lines(path: str | Path) -> list[str]:
    """All lines of a text file (line breaks removed)."""
    return [line for _, line in _lines(Path(path))]


def read_texts(path: str | Path, *, text_field: str | None = None, what: str = "texts",
               field_option: str | None = None) -> list[str]:
    """The non-blank texts of a file, stripped: one per line, or the text column / field of a .tsv, .csv or
    .jsonl file. ``what`` names the file in errors (e.g. "--original"); ``field_option``: the caller's option
    that names the text column, if it has one (errors suggest it)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} file {path} does not exist; give one text per line, or a .tsv/.csv/.jsonl file "
                        "with a text column")
    texts = [record.text.strip() for record in iter_records(path, text_field=text_field, field_option=field_option)
             if record.text.strip()]
    if not texts:
        raise DataError(f"{path} holds no texts (one per line, or a text column in .tsv/.csv/.jsonl)")
    return texts


def iter_records(path: str | Path, *, fmt: str | None = None, text_field: str | None = None,
                 id_field: str | None = None, field_option: str | None = "--text-field") -> Iterator[Record]:
    """Stream (id, text) records. Ids default to the 0-based record number.

    text: one record per line. jsonl: objects with a text field ("text", "sentence", ... or
    ``text_field``). csv/tsv: a header row; the text column is ``text_field`` or the first of
    "text"/"sentence"/...; ``id_field`` names an id column or key. ``field_option``: the command's option
    that sets ``text_field``, named in the error when no text column is found (None: the command has none).
    """
    path = Path(path)
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise DataError(f"unknown input format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "text":
        for index, (_, line) in enumerate(_lines(path)):
            yield Record(str(index), line)
    elif fmt == "jsonl":
        index = 0
        for number, obj in json_objects(path):
            key = text_field or next((k for k in TEXT_KEYS if k in obj), None)
            if key is None or key not in obj:
                raise DataError(f"{path}:{number}: no text field ({text_field or ' / '.join(TEXT_KEYS)})"
                                + (f"; name yours with {field_option}" if field_option and not text_field else ""))
            if not isinstance(obj[key], str):
                raise DataError(f"{path}:{number}: field {key!r} must be a string, found {type(obj[key]).__name__}")
            record_id = obj.get(id_field) if id_field else obj.get("id", index)
            yield Record(str(record_id), obj[key])
            index += 1
    else:
        delimiter = "," if fmt == "csv" else "\t"
        reader = csv.reader(_LineStream(_lines(path)), delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            return
        key = text_field or next((k for k in TEXT_KEYS if k in header), None)
        if key is None or key not in header:
            raise DataError(f"{path}:1: no text column among {header}; name it {' / '.join(TEXT_KEYS)}"
                            + (f" or give it with {field_option}" if field_option else ""))
        text_column = header.index(key)
        id_column = header.index(id_field) if id_field and id_field in header else None
        if id_field and id_column is None:
            raise DataError(f"{path}:1: no id column {id_field!r} among {header}")
        for index, row in enumerate(reader):
            if len(row) <= text_column:
                raise DataError(f"{path}:{reader.line_num}: row has {len(row)} column(s), "
                                f"the text column {key!r} is column {text_column + 1}")
            yield Record(row[id_column] if id_column is not None else str(index), row[text_column])


def json_objects(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file."""
    for number, line in _lines(path):
        if line.strip():
            yield number, parse_json_line(line, path, number)


def parse_json_line(text: str, path: Path | str, number: int) -> dict:
    """The JSON object on line ``number`` of ``path``; a DataError naming the place if it is not one."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(obj, dict):
        raise DataError(f"{path}:{number}: expected a JSON object, found {type(obj).__name__}")
    return obj


class _LineStream(io.TextIOBase):
    """Feeds decoded lines to the csv module (which wants an iterator of strings)."""

    def __init__(self, lines: Iterator[tuple[int, str]]) -> None:
        self._lines = lines

    def __iter__(self):
        return self

    def __next__(self) -> str:
        return next(self._lines)[1] + "\n"


def count_records(path: str | Path, **kwargs) -> int:
    """Records in a file, counted by streaming (no texts are kept)."""
    return sum(1 for _ in iter_records(path, **kwargs))


@dataclass(frozen=True)
class STSPair:
    score: float
    sentence1: str
    sentence2: str


def read_sts(path: str | Path) -> list[STSPair]:
    """STS-B format: tab-separated, no header, score in column 5 and the sentences in 6 and 7
    (extra trailing columns, as in the official files, are ignored)."""
    path = Path(path)
    pairs = []
    for number, line in _lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 7:
            raise DataError(f"{path}:{number}: expected at least 7 tab-separated columns (STS-B format), "
                            f"found {len(fields)}")
        try:
            score = float(fields[4])
        except ValueError as exc:
            raise DataError(f"{path}:{number}: column 5 must be a similarity score, found {fields[4]!r}") from exc
        pairs.append(STSPair(score, fields[5], fields[6]))
    if not pairs:
        raise DataError(f"{path} holds no sentence pairs")
    return pairs
