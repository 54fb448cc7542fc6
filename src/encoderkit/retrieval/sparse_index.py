"""An inverted index of sparse vectors (SPLADE's): exact dot products, built in bounded memory, memory-mapped.

Layout on disk (a directory): per term t, its postings ``docs[indptr[t]:indptr[t+1]]`` (int32 rows, ascending) and
``weights[...]`` (float32): ``indptr.npy`` (int64, dimension + 1), ``docs.npy``, ``weights.npy``, the ids, and
``index.json``.

Build (``SparseIndexBuilder``): documents arrive in chunks of ``SparseVectors``; chunks are buffered up to
``run_postings`` postings, then sorted by term (stable: rows stay ascending) and written as a run (two flat files)
whose per-term counts are kept (runs x dimension int32). ``finish`` merges the runs term range by term range, each
range holding at most ``merge_postings`` postings: every run's slice of the range is read with plain file reads
(no memory map, whose pages would count in the builder's resident memory) and scattered to its place, then the
range is appended to ``docs.npy`` and ``weights.npy``. Memory: one run's buffer plus one range, whatever the
corpus size; disk: the runs, then the index (about 8 bytes a posting each).

Search: per query, each of its terms adds ``query weight x posting weight`` to a float32 score per document (a
term's postings name each document once, so ``scores[docs] += ...`` is exact); the documents touched (sharing a
term with the query) are ranked, ties by ascending row. Documents sharing no term are not returned.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..embeddings.sparse_vectors import SparseVectors
from ..errors import DataError, InputError
from ..tasks.search import SearchResult
from .base import (check_k, check_model, check_queries, copy_directory, padded_result, read_ids, read_meta,
                   register_kind, top_k, write_meta)

RUN_POSTINGS = 16_000_000  # postings buffered before a run is written (16M: 192 MB of buffers)
MERGE_POSTINGS = 8_000_000  # postings per merged term range (8M: about 200 MB with the scatter's temporaries)


class SparseIndexBuilder:
    """Streams SparseVectors into an inverted index in ``directory``: ``add`` chunks, then ``finish``."""

    def __init__(self, directory: str | Path, dimension: int, *, info: dict[str, Any] | None = None,
                 run_postings: int = RUN_POSTINGS, merge_postings: int = MERGE_POSTINGS,
                 show_progress: bool = False) -> None:
        if dimension <= 0:
            raise InputError(f"the vocabulary size (dimension) must be positive, found {dimension}")
        if run_postings < 1 or merge_postings < 1:
            raise InputError("run_postings and merge_postings must be positive")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in ("index.json", "indptr.npy", "docs.npy", "weights.npy", "ids.txt", "ids.npy", "ids.offsets.npy",
                      "ids.bytes"):
            (self.directory / stale).unlink(missing_ok=True)
        self.dimension, self.info = dimension, dict(info or {})
        self.run_postings, self.merge_postings = run_postings, merge_postings
        self.show_progress = show_progress
        self.rows = 0
        self._buffer: list[SparseVectors] = []
        self._buffered = 0
        self._runs: list[tuple[Path, Path]] = []
        self._run_counts: list[np.ndarray] = []  # per run, postings per term (int32)
        self._ids = _GrowingIds(self.directory)

    def add(self, vectors: SparseVectors, ids: Sequence[Any] | None = None) -> None:
        """Append documents (rows of ``vectors``); ``ids`` default to their row numbers."""
        if not isinstance(vectors, SparseVectors):
            raise InputError(f"a sparse index takes SparseVectors (SparseEmbedder.encode), found "
                             f"{type(vectors).__name__}")
        if vectors.dimension != self.dimension:
            raise InputError(f"the index's vocabulary has {self.dimension} terms but these vectors have "
                             f"{vectors.dimension}: were they encoded by another model?")
        if ids is not None and len(ids) != len(vectors):
            raise InputError(f"got {len(vectors)} vectors but {len(ids)} ids")
        if self.rows + len(vectors) >= 2 ** 31:
            raise InputError("a sparse index holds at most 2^31 - 1 documents (int32 rows)")
        self._ids.write([str(i) for i in ids] if ids is not None
                        else [str(i) for i in range(self.rows, self.rows + len(vectors))])
        if vectors.nnz and not np.isfinite(vectors.values).all():
            raise InputError("the sparse vectors hold NaN or infinite weights")
        self._buffer.append(_with_offset(vectors, self.rows))
        self.rows += len(vectors)
        self._buffered += vectors.nnz
        if self._buffered >= self.run_postings:
            self._write_run()

    def _write_run(self) -> None:
        if not self._buffer:
            return
        terms = np.concatenate([b.indices for b in self._buffer])
        rows = np.concatenate([np.repeat(np.arange(b.first, b.first + len(b)), np.diff(b.indptr)).astype(np.int32)
                               for b in self._buffer])
        weights = np.concatenate([b.values for b in self._buffer])
        self._buffer, self._buffered = [], 0
        order = np.argsort(terms, kind="stable")  # rows stay ascending within a term
        number = len(self._runs)
        paths = (self.directory / f"run-{number}.docs", self.directory / f"run-{number}.weights")
        rows[order].tofile(paths[0])
        weights[order].tofile(paths[1])
        self._runs.append(paths)
        self._run_counts.append(np.bincount(terms, minlength=self.dimension).astype(np.int32))

    def finish(self) -> "SparseIndex":
        """Merge the runs into the index, write index.json, and return it loaded (memory-mapped)."""
        from ..embeddings.compressed import _NpyWriter
        from ..progress import Progress

        if self.rows == 0:
            raise InputError("the corpus is empty: a sparse index needs at least one document")
        self._write_run()
        self._ids.close()
        counts = np.zeros(self.dimension, np.int64)
        for run in self._run_counts:
            counts += run
        indptr = np.concatenate([[0], np.cumsum(counts)])
        total = int(indptr[-1])
        run_starts = [np.concatenate([[0], np.cumsum(run, dtype=np.int64)]) for run in self._run_counts]
        # where run r's postings of term t go, relative to the start of the term: the earlier runs' counts of t
        before = np.zeros(self.dimension, np.int64)
        run_base = []
        for run in self._run_counts:
            run_base.append(indptr[:-1] + before)
            before += run
        docs = _NpyWriter(self.directory / "docs.npy", (total,), np.int32)
        weights = _NpyWriter(self.directory / "weights.npy", (total,), np.float32)
        files = [(open(d, "rb"), open(w, "rb")) for d, w in self._runs]
        try:
            with Progress(total, "merging sparse postings", "postings", enabled=self.show_progress) as progress:
                for first, last in _term_ranges(indptr, self.merge_postings):
                    start, size = int(indptr[first]), int(indptr[last] - indptr[first])
                    out_docs, out_weights = np.empty(size, np.int32), np.empty(size, np.float32)
                    for (doc_file, weight_file), starts, counts_r, base in zip(files, run_starts, self._run_counts,
                                                                              run_base):
                        lo, hi = int(starts[first]), int(starts[last])
                        if hi == lo:
                            continue
                        part_docs = _read(doc_file, np.int32, lo, hi - lo)
                        part_weights = _read(weight_file, np.float32, lo, hi - lo)
                        term_counts = counts_r[first:last]
                        # each posting's place: its term's place for this run, plus its rank within the term
                        place = np.repeat(base[first:last] - start - (starts[first:last] - lo), term_counts)
                        place += np.arange(hi - lo)
                        out_docs[place], out_weights[place] = part_docs, part_weights
                    docs.write(out_docs)
                    weights.write(out_weights)
                    progress.advance(size)
        finally:
            for pair in files:
                for handle in pair:
                    handle.close()
            for pair in self._runs:
                for path in pair:
                    path.unlink(missing_ok=True)
        docs.close()
        weights.close()
        np.save(self.directory / "indptr.npy", indptr)
        write_meta(self.directory, "sparse", self.rows, {"dimension": self.dimension, "postings": total},
                   self.info)
        return SparseIndex.load(self.directory)


class _GrowingIds:
    """Ids of a build whose count is not known in advance: UTF-8 bytes and int64 end offsets appended to flat
    files, turned into IdColumn's files (ids.bytes, ids.offsets.npy) at ``close``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._bytes = open(directory / "ids.bytes", "wb")
        self._ends = open(directory / "ids.ends.tmp", "wb")
        self._end, self.count = 0, 0

    def write(self, ids: Sequence[str]) -> None:
        encoded = [i.replace("\n", " ").encode("utf-8") for i in ids]
        lengths = np.fromiter((len(e) for e in encoded), np.int64, len(encoded))
        np.asarray(self._end + np.cumsum(lengths), np.int64).tofile(self._ends)
        self._end += int(lengths.sum())
        self._bytes.write(b"".join(encoded))
        self.count += len(ids)

    def close(self) -> None:
        from ..embeddings.compressed import _NpyWriter

        self._bytes.close()
        self._ends.close()
        writer = _NpyWriter(self.directory / "ids.offsets.npy", (self.count + 1,), np.int64)
        writer.write(np.zeros(1, np.int64))
        with open(self.directory / "ids.ends.tmp", "rb") as ends:
            for start in range(0, self.count, 1 << 20):
                writer.write(_read(ends, np.int64, start, min(1 << 20, self.count - start)))
        writer.close()
        (self.directory / "ids.ends.tmp").unlink()


@dataclass
class _Chunk:
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    first: int  # the row of its first document in the index

    @property
    def nnz(self) -> int:
        return len(self.indices)

    def __len__(self) -> int:
        return len(self.indptr) - 1


def _with_offset(vectors: SparseVectors, first: int) -> _Chunk:
    return _Chunk(vectors.indptr, vectors.indices, vectors.values, first)


def _read(handle, dtype: Any, start: int, count: int) -> np.ndarray:
    """``count`` items of ``dtype`` from item ``start`` of a flat file, by a plain read."""
    dtype = np.dtype(dtype)
    data = os.pread(handle.fileno(), count * dtype.itemsize, start * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise DataError(f"{handle.name}: short read (the build's temporary files changed?)")
    return np.frombuffer(data, dtype=dtype)


def _term_ranges(indptr: np.ndarray, budget: int) -> Iterable[tuple[int, int]]:
    """Consecutive term ranges [first, last) of at most ``budget`` postings (one term above it: alone)."""
    terms = len(indptr) - 1
    first = 0
    while first < terms:
        last = int(np.searchsorted(indptr, indptr[first] + budget, side="right")) - 1
        last = min(max(last, first + 1), terms)
        yield first, last
        first = last


@register_kind
@dataclass
class SparseIndex:
    """A saved inverted index of sparse vectors (see the module's docstring); build with ``build_sparse_index`` or
    ``SparseIndexBuilder``, open with ``SparseIndex.load``."""

    directory: Path
    dimension: int
    ids: Sequence[str]
    info: dict[str, Any] = field(default_factory=dict)
    kind = "sparse"

    def __post_init__(self) -> None:
        self.indptr = np.load(self.directory / "indptr.npy")
        self.docs = np.load(self.directory / "docs.npy", mmap_mode="r")
        self.weights = np.load(self.directory / "weights.npy", mmap_mode="r")
        if len(self.indptr) != self.dimension + 1 or self.indptr[-1] != len(self.docs) \
                or len(self.docs) != len(self.weights):
            raise DataError(f"{self.directory}: indptr.npy, docs.npy and weights.npy do not agree")

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def settings(self) -> dict[str, Any]:
        return {"dimension": self.dimension, "postings": int(self.indptr[-1])}

    @classmethod
    def load(cls, directory: str | Path) -> "SparseIndex":
        directory = Path(directory)
        meta = read_meta(directory, "sparse")
        for name in ("indptr.npy", "docs.npy", "weights.npy"):
            if not (directory / name).is_file():
                raise DataError(f"{directory}: {name} is missing")
        return cls(directory, int(meta["params"]["dimension"]), read_ids(directory, meta["count"]),
                   meta.get("info", {}))

    def save(self, directory: str | Path) -> Path:
        return copy_directory(self.directory, Path(directory))

    def matched_terms(self, query: SparseVectors, row: int) -> list[tuple[int, float, float]]:
        """(term, query weight, document weight) of each term the first query shares with document ``row``,
        largest product first: why the document scored (their products sum to its score). A term's postings are
        ascending rows, so each lookup is a binary search."""
        terms, values = query.row(0)
        shared = []
        for term, value in zip(terms.tolist(), values.tolist()):
            begin, end = int(self.indptr[term]), int(self.indptr[term + 1])
            at = begin + int(np.searchsorted(self.docs[begin:end], row))
            if at < end and int(self.docs[at]) == row:
                shared.append((term, value, float(self.weights[at])))
        return sorted(shared, key=lambda t: -t[1] * t[2])

    def search(self, queries: SparseVectors, k: int = 10, *, model: str | None = None) -> SearchResult:
        """The k documents of highest dot product with each query (SparseVectors over the same vocabulary)."""
        check_queries(self.kind, queries)
        check_model(self.info.get("model"), model)
        check_k(k)
        if queries.dimension != self.dimension:
            raise InputError(f"the queries have {queries.dimension} dimensions but the index's vocabulary has "
                             f"{self.dimension} terms: encode them with the index's model "
                             f"({self.info.get('model', 'unknown')})")
        k = min(k, len(self.ids))
        scores = np.zeros(len(self.ids), np.float32)
        results = []
        for q in range(len(queries)):
            terms, values = queries.row(q)
            touched = []
            for term, value in zip(terms.tolist(), values.tolist()):
                begin, end = self.indptr[term], self.indptr[term + 1]
                if begin == end:
                    continue
                docs = np.asarray(self.docs[begin:end])
                scores[docs] += value * np.asarray(self.weights[begin:end])
                touched.append(docs)
            if not touched:
                results.append((np.zeros(0, np.float32), np.zeros(0, np.int64)))
                continue
            rows = touched[0] if len(touched) == 1 else _union(touched, len(self.ids))
            results.append(top_k(scores[rows], rows.astype(np.int64), k))
            scores[rows] = 0
        return padded_result(results, k, self.ids)


def _union(parts: list[np.ndarray], count: int) -> np.ndarray:
    """The distinct rows of several posting lists: by a mask over all documents where they are many."""
    total = sum(len(p) for p in parts)
    if total * 8 < count:
        rows = np.sort(np.concatenate(parts))
        return rows[np.concatenate([[True], rows[1:] != rows[:-1]])]
    mask = np.zeros(count, bool)
    for part in parts:
        mask[part] = True
    return np.flatnonzero(mask)


def build_sparse_index(chunks: SparseVectors | Iterable[SparseVectors], directory: str | Path, *,
                       ids: Sequence[Any] | None = None, info: dict[str, Any] | None = None,
                       show_progress: bool = False, **builder_options: Any) -> SparseIndex:
    """Build a sparse index in ``directory`` from SparseVectors, or an iterable of chunks of them (streamed: one
    chunk in memory at a time). ``ids``: one per document over all chunks (default: row numbers)."""
    if isinstance(chunks, SparseVectors):
        chunks = [chunks]
    builder: SparseIndexBuilder | None = None
    done = 0
    for chunk in chunks:
        if not isinstance(chunk, SparseVectors):
            raise InputError(f"a sparse index takes SparseVectors (SparseEmbedder.encode), found "
                             f"{type(chunk).__name__}")
        if builder is None:
            builder = SparseIndexBuilder(directory, chunk.dimension, info=info, show_progress=show_progress,
                                         **builder_options)
        chunk_ids = None if ids is None else ids[done:done + len(chunk)]
        if ids is not None and len(chunk_ids) != len(chunk):
            raise InputError(f"more documents than the {len(ids)} ids given")
        builder.add(chunk, chunk_ids)
        done += len(chunk)
    if builder is None or builder.rows == 0:
        raise InputError("the corpus is empty: a sparse index needs at least one document")
    if ids is not None and done != len(ids):
        raise InputError(f"got {done} documents but {len(ids)} ids")
    return builder.finish()
