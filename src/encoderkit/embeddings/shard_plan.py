"""Embeddings as Parquet shards: the input cut into fixed shards, each read, embedded and written on its own.

A job over many input files (JSONL, Parquet or text; a file, a directory or a glob) is planned once, on the
driver: every file is cut into shards of ``shard_size`` rows (the last one of a file shorter), numbered in the
order of the sorted files. The plan depends only on the input bytes and ``shard_size``, so a rerun finds the
same shards. Output shard ``i`` (``shard-00000i.parquet``, columns ``id`` string and ``embedding``
list<float32>) holds exactly the rows of input shard ``i``; it is written to a temporary name and renamed,
so a shard file is either absent or complete, and ``manifest.json`` (rewritten atomically after every shard)
records which shards are done. A rerun skips those: no id is written twice.

Nothing here imports Ray: the planning, the reading of one shard, the writing and the manifest are plain
Python, used by the Ray job (``encoderkit.embeddings.distributed``) and by readers of its output (``read_shards``).
The output's layout (columns, manifest name and format) is ``encoderkit.embeddings.shards``'s.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..data.readers import TEXT_KEYS, parse_json_line
from ..errors import DataError, InputError
from ..security.provenance import sha256_file
from .shards import (MANIFEST, MANIFEST_FORMAT, MANIFEST_VERSION, EmbeddingShards, load_manifest,
                     write_embedding_table, write_json_atomically)

SHARD_PATTERN = "shard-{index:06d}.parquet"
# Input formats by file suffix; any other suffix of a file named on its own is read as text (one per line).
SUFFIX_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".txt": "text"}


@dataclass(frozen=True)
class InputShard:
    """Rows ``start`` .. ``start + rows`` of one input file; ``offset``/``line``: where its first row begins
    (byte offset and 1-based line number; text and JSONL files only)."""
    index: int
    path: str
    format: str
    start: int
    rows: int
    text_field: str | None
    id_field: str | None  # None: ids are ``id_prefix`` + the row number in the file
    id_prefix: str
    offset: int = 0
    line: int = 1

    @property
    def file_name(self) -> str:
        return SHARD_PATTERN.format(index=self.index)


@dataclass
class InputFile:
    path: str
    name: str  # relative to the input's root: names the file in ids (several files) and in the manifest
    format: str
    rows: int
    bytes: int
    sha256: str
    text_field: str | None
    id_field: str | None
    starts: list[tuple[int, int]] = field(default_factory=list)  # (byte offset, line) of each shard (text/JSONL)

    def record(self) -> dict[str, Any]:
        data = asdict(self)
        del data["starts"]
        return data


@dataclass
class Plan:
    files: list[InputFile]
    shards: list[InputShard]
    shard_size: int

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    def fingerprint(self) -> str:
        """One hash over every file's name, format, size and content hash, and the fields it is read by."""
        digest = hashlib.sha256()
        for f in self.files:
            digest.update(json.dumps([f.name, f.format, f.bytes, f.sha256, f.text_field, f.id_field]).encode())
        return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Planning: which files, how many rows, where each shard starts
# ---------------------------------------------------------------------------------------------
def resolve_inputs(spec: str | Path) -> tuple[list[Path], Path]:
    """The input files of ``spec`` (a file, a directory searched recursively, or a glob), sorted, and the root
    their names are given relative to."""
    text = os.path.expanduser(str(spec))
    path = Path(text)
    if path.is_file():
        return [path.resolve()], path.resolve().parent
    if path.is_dir():
        root = path.resolve()
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIX_FORMATS
                       and not any(part.startswith((".", "_")) for part in p.relative_to(root).parts))
        if not files:
            raise DataError(f"input directory {path} holds no .jsonl, .parquet or .txt files")
        return files, root
    if glob.has_magic(text):
        files = sorted(Path(p).resolve() for p in glob.glob(text, recursive=True) if Path(p).is_file())
        if not files:
            raise DataError(f"no input file matches {text!r}")
        root = Path(os.path.commonpath([str(p.parent) for p in files]))
        return files, root
    raise DataError(f"input not found: {text} (give a file, a directory, or a glob such as 'data/*.jsonl')")


def file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        raise DataError(f"{path}: the Ray engine reads JSONL, Parquet or text files; embed CSV/TSV files with "
                        "--engine local, or convert them to JSONL")
    return SUFFIX_FORMATS.get(suffix, "text")


def plan_shards(spec: str | Path, *, shard_size: int, text_field: str | None = None,
                id_field: str | None = None) -> Plan:
    """Read every input file once (counting rows, hashing bytes, checking the text and id fields) and cut it
    into shards of ``shard_size`` rows. Bad input fails here, before any cluster starts."""
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size <= 0:
        raise InputError(f"the shard size (--chunk-size) must be a positive integer, found {shard_size!r}")
    paths, root = resolve_inputs(spec)
    files = [_scan(path, str(path.relative_to(root)), shard_size, text_field, id_field) for path in paths]
    if sum(f.rows for f in files) == 0:
        raise DataError(f"{spec} holds no records to embed")
    shards: list[InputShard] = []
    several = len(files) > 1
    for f in files:
        for number, start in enumerate(range(0, f.rows, shard_size)):
            offset, line = f.starts[number] if f.starts else (0, 1)
            shards.append(InputShard(index=len(shards), path=f.path, format=f.format, start=start,
                                rows=min(shard_size, f.rows - start), text_field=f.text_field, id_field=f.id_field,
                                id_prefix=f"{f.name}:" if several else "", offset=offset, line=line))
    return Plan(files, shards, shard_size)


def _scan(path: Path, name: str, shard_size: int, text_field: str | None, id_field: str | None) -> InputFile:
    fmt = file_format(path)
    if fmt == "parquet":
        return _scan_parquet(path, name, text_field, id_field)
    if fmt == "text" and (text_field or id_field):
        option = "--text-field" if text_field else "--id-field"
        raise DataError(f"{path} is a text file (one text per line, ids are line numbers): it has no fields for "
                        f"{option}; give JSONL or Parquet files, or drop {option}")
    digest, rows, offset, starts = hashlib.sha256(), 0, 0, []
    first: dict | None = None
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            digest.update(raw)
            if fmt == "text" or raw.strip():
                if rows % shard_size == 0:
                    starts.append((offset, line_number))
                if fmt == "jsonl" and first is None:
                    first = _json_object(raw, path, line_number)
                rows += 1
            offset += len(raw)
    if fmt == "text":
        return InputFile(str(path), name, fmt, rows, offset, digest.hexdigest(), None, None, starts)
    if first is None:
        return InputFile(str(path), name, fmt, 0, offset, digest.hexdigest(), text_field, id_field, starts)
    text_key, id_key = _fields(list(first), path, text_field, id_field, "field", starts[0][1])
    return InputFile(str(path), name, fmt, rows, offset, digest.hexdigest(), text_key, id_key, starts)


def _scan_parquet(path: Path, name: str, text_field: str | None, id_field: str | None) -> InputFile:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a file that is not Parquet
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from exc
    text_key, id_key = _fields(parquet.schema_arrow.names, path, text_field, id_field, "column", None)
    import pyarrow as pa

    if not pa.types.is_string(parquet.schema_arrow.field(text_key).type) \
            and not pa.types.is_large_string(parquet.schema_arrow.field(text_key).type):
        raise DataError(f"{path}: column {text_key!r} must hold strings, found {parquet.schema_arrow.field(text_key).type}")
    return InputFile(str(path), name, "parquet", parquet.metadata.num_rows, path.stat().st_size, sha256_file(path),
                     text_key, id_key)


def _fields(names: list[str], path: Path, text_field: str | None, id_field: str | None, kind: str,
            line: int | None) -> tuple[str, str | None]:
    """The text field (given, or the first of text/sentence/...) and the id field (given, or "id" if present)."""
    where = f"{path}:{line}" if line is not None else str(path)
    text_key = text_field or next((k for k in TEXT_KEYS if k in names), None)
    if text_key is None or text_key not in names:
        wanted = repr(text_field) if text_field else " / ".join(TEXT_KEYS)
        raise DataError(f"{where}: no text {kind} {wanted} among {names}; name yours with --text-field")
    if id_field is not None and id_field not in names:
        raise DataError(f"{where}: no id {kind} {id_field!r} among {names}; name yours with --id-field, or drop "
                        "it to number the records")
    return text_key, id_field or ("id" if "id" in names else None)


def _json_object(raw: bytes, path: Path | str, line: int) -> dict:
    text = raw.decode("utf-8", errors="replace")  # as encoderkit.data.readers: bad bytes become U+FFFD
    return parse_json_line(text.lstrip("\ufeff") if line == 1 else text, path, line)


# ---------------------------------------------------------------------------------------------
# Reading one shard
# ---------------------------------------------------------------------------------------------
def read_shard(shard: InputShard) -> tuple[list[str], list[str]]:
    """(ids, texts) of one shard, read straight from its place in the input file."""
    path = Path(shard.path)
    if not path.is_file():
        raise DataError(f"input file not found: {path} (it was there when the job was planned; was it moved?)")
    if shard.format == "parquet":
        return _read_parquet_rows(shard)
    ids, texts = [], []
    with open(path, "rb") as handle:
        handle.seek(shard.offset)
        line = shard.line - 1
        while len(texts) < shard.rows:
            raw = handle.readline()
            line += 1
            if not raw:
                raise DataError(f"{path} ended after line {line - 1}, before the {shard.rows} rows planned from line "
                                f"{shard.line}: the file changed since the job was planned")
            if shard.format == "text":
                if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                texts.append(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
                ids.append(f"{shard.id_prefix}{shard.start + len(ids)}")
                continue
            if not raw.strip():
                continue
            obj = _json_object(raw, path, line)
            for key, what in ((shard.text_field, "text"), (shard.id_field, "id")):
                if key is not None and key not in obj:
                    raise DataError(f"{path}:{line}: no {what} field {key!r}")
            text = obj[shard.text_field]
            if not isinstance(text, str):
                raise DataError(f"{path}:{line}: field {shard.text_field!r} must be a string, "
                                f"found {type(text).__name__}")
            texts.append(text)
            ids.append(f"{shard.id_prefix}{shard.start + len(ids)}" if shard.id_field is None
                       else str(obj[shard.id_field]))
    return ids, texts


def _read_parquet_rows(shard: InputShard) -> tuple[list[str], list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(shard.path)
    columns = [shard.text_field] + ([shard.id_field] if shard.id_field and shard.id_field != shard.text_field else [])
    groups, first_row, row = [], None, 0
    for group in range(parquet.metadata.num_row_groups):  # only the row groups that overlap the shard
        count = parquet.metadata.row_group(group).num_rows
        if row + count > shard.start and row < shard.start + shard.rows:
            groups.append(group)
            first_row = row if first_row is None else first_row
        row += count
    table = parquet.read_row_groups(groups, columns=columns).slice(shard.start - (first_row or 0), shard.rows)
    if table.num_rows != shard.rows:
        raise DataError(f"{shard.path} holds fewer rows than planned: the file changed since the job was planned")
    text_column = table.column(shard.text_field)
    if text_column.null_count:
        raise DataError(f"{shard.path}: column {shard.text_field!r} has missing (null) texts in rows "
                        f"{shard.start}..{shard.start + shard.rows - 1}")
    texts = text_column.to_pylist()
    if shard.id_field is None:
        return [f"{shard.id_prefix}{shard.start + i}" for i in range(shard.rows)], texts
    id_column = table.column(shard.id_field)
    if id_column.null_count:
        raise DataError(f"{shard.path}: column {shard.id_field!r} has missing (null) ids in rows "
                        f"{shard.start}..{shard.start + shard.rows - 1}")
    return id_column.cast(pa.string()).to_pylist(), texts


# ---------------------------------------------------------------------------------------------
# Writing shards and the manifest
# ---------------------------------------------------------------------------------------------
def write_shard(out_dir: Path, shard: InputShard, ids: list[str], vectors: np.ndarray) -> dict[str, Any]:
    """Write one output shard (temporary name, fsync, rename) and return its manifest entry."""
    if vectors.ndim != 2 or len(vectors) != len(ids) or len(ids) != shard.rows:
        raise InputError(f"shard {shard.index}: expected {shard.rows} ids and vectors, found {len(ids)} ids and "
                         f"an array of shape {vectors.shape}")
    write_embedding_table(out_dir / shard.file_name, [str(i) for i in ids], vectors)
    return shard_entry(shard, ids)


def shard_entry(shard: InputShard, ids: list[str]) -> dict[str, Any]:
    return {"index": shard.index, "path": shard.file_name, "rows": shard.rows, "input": shard.path,
            "input_start": shard.start,
            "ids": {"count": len(ids), "first": ids[0], "last": ids[-1], "min": min(ids), "max": max(ids)}}


def read_manifest(out_dir: str | Path) -> dict[str, Any] | None:
    """The Ray engine's manifest in ``out_dir`` (None: there is none), finished or not."""
    return load_manifest(out_dir, strict=True, require_complete=False)


def read_shards(out_dir: str | Path, *, require_complete: bool = True) -> Iterator[tuple[list[str], np.ndarray]]:
    """(ids, float32 matrix) of each shard written into ``out_dir``, in shard order."""
    manifest = load_manifest(out_dir, strict=True, require_complete=require_complete)
    if manifest is None:
        raise DataError(f"{out_dir} holds no {MANIFEST}: not the output of `encoderkit embed --engine ray`")
    shards = EmbeddingShards.open(out_dir, manifest)
    for shard in shards.shards:
        parts = list(shards.shard_batches(shard, batch_rows=max(1, shard.rows)))
        yield ([str(i) for part, _ in parts for i in part],
               np.concatenate([v for _, v in parts]) if parts else np.zeros((0, shards.dimension), np.float32))


# ---------------------------------------------------------------------------------------------
# The output directory: a new job, a job to resume, or someone else's job (refused)
# ---------------------------------------------------------------------------------------------
# What makes two runs the same job: a manifest that differs in any of these belongs to another job.
IDENTITY = {"model": "model (or its settings: pooling, dtype, max length, truncation)", "dimension": "dimension",
            "input": "input files (or their --text-field / --id-field)", "shard_size": "shard size (--chunk-size)"}


def new_manifest(plan: Plan, model: dict[str, Any], dimension: int) -> dict[str, Any]:
    return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "model": model, "dimension": dimension,
            "dtype": "float32",
            "columns": {"id": "string", "embedding": f"list<float32> ({dimension} values)"},
            "shard_size": plan.shard_size,
            "input": {"fingerprint": plan.fingerprint(), "files": [f.record() for f in plan.files]},
            "rows": plan.rows, "shard_count": len(plan.shards), "count": 0, "complete": False, "shards": []}


def prepare_output(out_dir: str | Path, manifest: dict[str, Any], plan: Plan, *, restart: bool = False,
                   write: bool = True) -> tuple[dict[str, Any], list[InputShard]]:
    """Ready ``out_dir`` for the job ``manifest`` describes: a new directory, the same job to resume (its
    finished shards kept), or, with ``restart``, this job's files removed. Refuses a directory that holds
    another job or other files. Returns the manifest to continue and the shards still to embed; ``write=False``
    only checks and plans (nothing is created, removed or written)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir} is a file; the Ray engine writes a directory of Parquet shards")
    present = sorted(out_dir.iterdir()) if out_dir.is_dir() else []
    ours = [p for p in present if p.name.startswith(("shard-", MANIFEST))]
    existing = None if restart else read_manifest(out_dir)
    if existing is None:
        others = [p.name for p in present if p not in ours] + ([] if restart else [p.name for p in ours])
        if others:
            raise InputError(f"--out {out_dir} is not empty ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}"
                             f") and holds no {MANIFEST}: choose a new or empty directory")
    else:
        differs = [label for key, label in IDENTITY.items() if _identity(existing, key) != _identity(manifest, key)]
        if differs:
            raise InputError(f"--out {out_dir} holds embeddings of another job: its {' and its '.join(differs)} "
                             f"differ from this run's ({MANIFEST}). To resume that job, rerun it with its own model, "
                             "input and options; to replace its shards, add --restart; or choose another --out")
    done: dict[int, dict[str, Any]] = {}
    if existing is not None:
        recorded = {entry["index"]: entry for entry in existing.get("shards", [])}
        for shard in plan.shards:
            path = out_dir / shard.file_name
            if path.is_file():  # recorded, or renamed but not yet recorded when the job stopped
                entry = recorded.get(shard.index) or _adopt(path, shard)
                if entry is not None:
                    done[shard.index] = entry
    manifest = dict(manifest, shards=[done[i] for i in sorted(done)])
    manifest["count"] = sum(entry["rows"] for entry in manifest["shards"])
    manifest["complete"] = len(done) == len(plan.shards)
    if write:
        out_dir.mkdir(parents=True, exist_ok=True)
        for path in ours:  # --restart's old files, a writer's leftovers (*.tmp), unusable shard files
            if restart or path.name.endswith(".tmp") or (path.name.startswith("shard-") and not any(
                    entry["path"] == path.name for entry in manifest["shards"])):
                path.unlink()
        write_json_atomically(out_dir / MANIFEST, manifest)
    return manifest, [shard for shard in plan.shards if shard.index not in done]


def _identity(manifest: dict[str, Any], key: str) -> Any:
    value = manifest.get(key)
    if key == "model" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "path"}  # a moved model directory is the same model
    if key == "input" and isinstance(value, dict):
        return value.get("fingerprint")
    return value


def _adopt(path: Path, shard: InputShard) -> dict[str, Any] | None:
    """The manifest entry of a complete shard file that the manifest does not list yet (None: not usable)."""
    import pyarrow.parquet as pq

    try:
        ids = pq.read_table(path, columns=["id"]).column("id").to_pylist()
    except Exception:  # noqa: BLE001 - an unreadable file is embedded again
        ids = []
    return shard_entry(shard, ids) if len(ids) == shard.rows else None
