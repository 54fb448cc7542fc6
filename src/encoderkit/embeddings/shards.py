"""Embeddings stored as Parquet shards: read them in bounded memory, sample them, write small ones.

The layout (written by the embed command's sharded writer, and by ``write_shards`` here): a
directory of Parquet files with a column ``id`` (string or integer) and a column ``embedding``
(a list of float32, all of one length), plus ``manifest.json``::

    {"format": "encoderkit-embeddings", "version": 1, "dimension": 384, "count": 1000000,
     "model": "...", "shards": [{"path": "part-00000.parquet", "rows": 65536}, ...]}

Only ``shards`` is read from the manifest (entries may also be plain file names); without a
manifest, or when it lists no shards, every ``*.parquet`` file of the directory is read in name
order. Rows are read a batch at a time, so memory stays bounded whatever the shard sizes.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import DataError, InputError

ID_COLUMN, EMBEDDING_COLUMN = "id", "embedding"
MANIFEST = "manifest.json"
MANIFEST_FORMAT, MANIFEST_VERSION = "encoderkit-embeddings", 1


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise InputError("reading Parquet embedding shards needs pyarrow: pip install pyarrow") from exc
    return pyarrow


@dataclass
class Shard:
    path: Path
    rows: int
    dimension: int
    id_kind: str  # "int" or "string"


@dataclass
class EmbeddingShards:
    """A checked view of a shard directory: every shard exists, has both columns and one vector width."""

    directory: Path
    shards: list[Shard]
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(shard.rows for shard in self.shards)

    @property
    def dimension(self) -> int:
        return self.shards[0].dimension

    @property
    def id_kind(self) -> str:
        return "int" if all(shard.id_kind == "int" for shard in self.shards) else "string"

    @classmethod
    def open(cls, directory: str | Path, manifest: dict[str, Any] | None = None) -> "EmbeddingShards":
        """The shards of ``directory``; ``manifest``: its manifest already read by ``load_manifest`` (default:
        read here, refusing an unfinished job's)."""
        directory = Path(directory)
        if not directory.is_dir():
            raise DataError(f"embedding shards not found: {directory} is not a directory")
        manifest_path = directory / MANIFEST
        if manifest is None:
            manifest = load_manifest(directory) or {}
        listed = manifest.get("shards") or []
        if listed:
            paths = [directory / (entry if isinstance(entry, str) else entry.get("path") or entry.get("file", ""))
                     for entry in listed]
            missing = [str(path) for path in paths if not path.is_file()]
            if missing:
                raise DataError(f"{manifest_path} lists {len(missing)} shard(s) that do not exist: "
                                f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; re-run the embed "
                                "command or restore the files")
        else:
            paths = sorted(directory.glob("*.parquet"))
            if not paths:
                raise DataError(f"{directory} holds no *.parquet shards (and no manifest.json listing them)")
        shards = [_inspect(path) for path in paths]
        widths = {shard.dimension for shard in shards}
        if len(widths) > 1:
            by_width = {width: next(s.path.name for s in shards if s.dimension == width) for width in sorted(widths)}
            raise DataError(f"{directory}: the shards mix vector dimensions "
                            + ", ".join(f"{width} (e.g. {name})" for width, name in by_width.items())
                            + "; all shards of one index must come from one model and --truncate-dim")
        if sum(shard.rows for shard in shards) == 0:
            raise DataError(f"{directory}: the shards hold no rows")
        return cls(directory, shards, manifest)

    def iter_batches(self, batch_rows: int = 65536) -> Iterator[tuple[np.ndarray | list[str], np.ndarray]]:
        """(ids, float32 vectors of shape (rows, dimension)) a batch at a time, in shard order."""
        for shard in self.shards:
            yield from self.shard_batches(shard, batch_rows)

    def shard_batches(self, shard: Shard, batch_rows: int = 65536) -> Iterator[tuple[np.ndarray | list[str],
                                                                                      np.ndarray]]:
        """(ids, float32 vectors) of one of the shards, a batch at a time."""
        handle = _pyarrow().parquet.ParquetFile(shard.path)
        for batch in handle.iter_batches(batch_size=batch_rows, columns=[ID_COLUMN, EMBEDDING_COLUMN]):
            yield _ids(batch.column(0), shard), _vectors(batch.column(1), shard)

    def sample(self, size: int, seed: int = 0, batch_rows: int = 65536) -> np.ndarray:
        """``size`` distinct rows drawn uniformly (with ``seed``) across all shards, in storage order."""
        chosen = sample_rows(self.count, size, seed)
        size = len(chosen)
        out = np.empty((size, self.dimension), dtype=np.float32)
        filled, offset = 0, 0
        pa = _pyarrow()
        for shard in self.shards:
            lo, hi = np.searchsorted(chosen, [offset, offset + shard.rows])
            if hi > lo:
                handle = pa.parquet.ParquetFile(shard.path)
                start = offset
                for batch in handle.iter_batches(batch_size=batch_rows, columns=[EMBEDDING_COLUMN]):
                    a, b = np.searchsorted(chosen, [start, start + batch.num_rows])
                    if b > a:
                        out[filled:filled + b - a] = _vectors(batch.column(0), shard)[chosen[a:b] - start]
                        filled += b - a
                    start += batch.num_rows
            offset += shard.rows
        return out


def sample_rows(count: int, size: int, seed: int = 0) -> np.ndarray:
    """``min(size, count)`` distinct row numbers below ``count``, drawn with ``seed``, in increasing order."""
    return np.sort(np.random.default_rng(seed).choice(count, size=min(size, count), replace=False))


def load_manifest(directory: str | Path, *, strict: bool = False,
                  require_complete: bool = True) -> dict[str, Any] | None:
    """The ``manifest.json`` of a shard directory (None: there is none). ``strict`` (the Ray engine's output):
    it must be an encoderkit embeddings manifest of this format and version. ``require_complete``: refuse the
    manifest of a job that has not finished (``"complete": false``)."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        if strict:
            raise DataError(f"{path} is not valid JSON ({exc}); delete the directory or rerun with --restart") from exc
        raise DataError(f"{path} is not valid JSON: {exc}") from exc
    if strict and (not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT
                   or manifest.get("version") != MANIFEST_VERSION):
        raise DataError(f"{path} is not an encoderkit embeddings manifest (format {MANIFEST_FORMAT!r}, "
                        f"version {MANIFEST_VERSION})")
    if require_complete and manifest.get("complete") is False:  # the Ray engine records its shards as it goes
        raise DataError(f"{directory} holds the shards of an embedding job that has not finished "
                        f"({len(manifest.get('shards') or [])} of {manifest.get('shard_count', '?')} shards): "
                        "rerun the same `encoderkit embed` command to finish it, then build the index")
    return manifest


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it: readers see the old or the new."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomically(path: Path, data: dict[str, Any], *, indent: int = 1, ensure_ascii: bool = False) -> None:
    write_atomically(path, json.dumps(data, indent=indent, ensure_ascii=ensure_ascii) + "\n")


def write_embedding_table(path: Path, ids: Sequence[str] | Sequence[int] | np.ndarray, vectors: np.ndarray) -> None:
    """One Parquet file of ``ids`` and ``vectors`` (rows, dimension) as float32 lists, written (and synced) to a
    temporary name and renamed: the file is either absent or complete."""
    pa = _pyarrow()
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    embedding = pa.ListArray.from_arrays(
        pa.array(np.arange(0, vectors.size + 1, max(1, vectors.shape[1]), dtype=np.int32)),
        pa.array(vectors.reshape(-1)))
    table = pa.table({ID_COLUMN: pa.array(ids if isinstance(ids, np.ndarray) else list(ids)),
                      EMBEDDING_COLUMN: embedding})
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        pa.parquet.write_table(table, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _inspect(path: Path) -> Shard:
    pa = _pyarrow()
    try:
        handle = pa.parquet.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise DataError(f"{path} is not a readable Parquet file: {exc}") from exc
    schema = handle.schema_arrow
    for column, what in ((ID_COLUMN, "the record ids (string or integer)"),
                         (EMBEDDING_COLUMN, "the vectors (list<float32>)")):
        if schema.get_field_index(column) < 0:
            raise DataError(f"{path} has no column {column!r} for {what}; found columns "
                            f"{', '.join(schema.names) or 'none'}")
    id_type, vector_type = schema.field(ID_COLUMN).type, schema.field(EMBEDDING_COLUMN).type
    if pa.types.is_integer(id_type):
        id_kind = "int"
    elif pa.types.is_string(id_type) or pa.types.is_large_string(id_type):
        id_kind = "string"
    else:
        raise DataError(f"{path}: column 'id' must hold strings or integers, found {id_type}")
    if not (pa.types.is_list(vector_type) or pa.types.is_large_list(vector_type)
            or pa.types.is_fixed_size_list(vector_type)) or not pa.types.is_floating(vector_type.value_type):
        raise DataError(f"{path}: column 'embedding' must be a list of floats, found {vector_type}")
    rows = handle.metadata.num_rows
    if pa.types.is_fixed_size_list(vector_type):
        dimension = vector_type.list_size
    elif rows == 0:
        dimension = 0
    else:
        first = next(handle.iter_batches(batch_size=1, columns=[EMBEDDING_COLUMN])).column(0)
        dimension = len(first[0]) if first[0].is_valid else 0
    if rows and dimension <= 0:
        raise DataError(f"{path}: the first embedding is empty or null")
    return Shard(path, rows, dimension, id_kind)


def _ids(column: Any, shard: Shard) -> np.ndarray | list[str]:
    if column.null_count:
        raise DataError(f"{shard.path}: {column.null_count} null id(s)")
    if shard.id_kind == "int":
        return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return column.to_pylist()


def _vectors(column: Any, shard: Shard) -> np.ndarray:
    """The list column as a (rows, dimension) float32 array, checking every row's length."""
    pa = _pyarrow()
    if column.null_count:
        raise DataError(f"{shard.path}: {column.null_count} null embedding(s)")
    if pa.types.is_fixed_size_list(column.type):
        values = column.flatten()
    else:
        offsets = column.offsets.to_numpy()
        lengths = np.diff(offsets)
        bad = np.flatnonzero(lengths != shard.dimension)
        if bad.size:
            raise DataError(f"{shard.path}: an embedding has {lengths[bad[0]]} values where the shard's first has "
                            f"{shard.dimension}; every vector must have one dimension")
        values = column.flatten()
    array = values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return array.reshape(len(column), shard.dimension)


class ShardWriter:
    """Write embeddings as numbered Parquet shards, a block at a time; ``close`` writes manifest.json."""

    def __init__(self, directory: str | Path, extra: dict[str, Any] | None = None) -> None:
        _pyarrow()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.extra, self.entries, self.dimension = dict(extra or {}), [], None

    def write(self, vectors: np.ndarray, ids: Sequence[str] | Sequence[int] | np.ndarray) -> Path:
        """One shard holding ``vectors`` (rows, dimension) and their ``ids``."""
        part = np.ascontiguousarray(vectors, dtype=np.float32)
        if part.ndim != 2:
            raise InputError(f"vectors must be a 2-D array, found shape {part.shape}")
        if len(ids) != len(part):
            raise InputError(f"got {len(part)} vectors but {len(ids)} ids")
        if self.dimension not in (None, part.shape[1]):
            raise InputError(f"this shard has {part.shape[1]}-dim vectors, the earlier ones {self.dimension}")
        self.dimension = part.shape[1]
        name = f"part-{len(self.entries):05d}.parquet"
        write_embedding_table(self.directory / name, ids, part)
        self.entries.append({"path": name, "rows": len(part)})
        return self.directory / name

    def close(self) -> Path:
        manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "dimension": self.dimension,
                    "count": sum(entry["rows"] for entry in self.entries), **self.extra, "shards": self.entries}
        write_json_atomically(self.directory / MANIFEST, manifest, indent=2, ensure_ascii=True)
        return self.directory


def write_shards(directory: str | Path, vectors: np.ndarray, ids: Sequence[str] | Sequence[int] | np.ndarray | None
                 = None, *, rows_per_shard: int = 100_000, extra: dict[str, Any] | None = None) -> Path:
    """Write ``vectors`` (rows, dimension) with ``ids`` (default: row numbers) as Parquet shards + manifest.json."""
    vectors = np.asarray(vectors)
    if vectors.ndim != 2:
        raise InputError(f"vectors must be a 2-D array, found shape {vectors.shape}")
    if ids is None:
        ids = np.arange(len(vectors), dtype=np.int64)
    if len(ids) != len(vectors):
        raise InputError(f"got {len(vectors)} vectors but {len(ids)} ids")
    writer = ShardWriter(directory, extra)
    for start in range(0, len(vectors), rows_per_shard):
        writer.write(vectors[start:start + rows_per_shard], ids[start:start + rows_per_shard])
    return writer.close()
