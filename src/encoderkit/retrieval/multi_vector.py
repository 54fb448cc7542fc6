"""A multi-vector (ColBERT) index: documents as lists of token vectors, scored by MaxSim.

MaxSim(query, document) = sum over the query's token vectors of the largest dot product with any of the
document's token vectors (ColBERT's late interaction; the vectors are taken as given, normalised by the encoder).

Layout on disk (a directory): ``tokens.bin``, every document's token vectors one after another as a raw
(total_tokens, dimension) float32 or float16 array (shape and dtype in ``index.json``), memory-mapped at search;
``offsets.npy`` (int64, documents + 1): document d's tokens are rows ``offsets[d]:offsets[d+1]``; the ids; and
``index.faiss`` when the corpus has ``ivf_min_tokens`` token vectors or more.

Search: with an IVF (FAISS, inner product, over all token vectors: ``nlist`` lists, ``nprobe`` probed, codes
"flat" or "sq8"), each query token fetches its ``token_candidates`` nearest token vectors; their documents are the
candidates, ranked by the approximate score (per query token, the best fetched token of the document; summed) and
cut to ``rerank_depth``, then scored exactly by MaxSim from the stored vectors. Below ``ivf_min_tokens`` (or with
``exact=True``) every document is scored exactly, in blocks. Ties are broken by ascending row.

The build streams: documents arrive in chunks, their vectors are appended to ``tokens.bin``; the IVF is trained
on a seeded sample of token vectors read back from the file, then filled block by block (FAISS keeps the codes
in memory while it builds: with "sq8", one byte per dimension and token).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import DataError, InputError
from ..extras import faiss_module
from ..tasks.search import SearchResult
from .base import (check_k, check_model, check_queries, copy_directory, padded_result, read_ids, read_meta,
                   register_kind, top_k, write_meta)
from .sparse_index import _GrowingIds

CODECS = ("flat", "sq8")
DTYPES = ("float32", "float16")
BLOCK_TOKENS = 65536  # token vectors scored (or added to the IVF) at a time


def _check_documents(docs: Sequence[np.ndarray], dimension: int | None, what: str = "document") -> list[np.ndarray]:
    arrays = []
    for number, doc in enumerate(docs):
        array = np.asarray(doc, dtype=np.float32)
        if array.ndim != 2:
            raise InputError(f"{what} {number}: token vectors must be a (tokens, dimension) array, found shape "
                             f"{array.shape}")
        if dimension is not None and array.shape[1] != dimension:
            raise InputError(f"{what} {number}: {array.shape[1]}-dim token vectors, the index's are {dimension}-dim "
                             "(encoded by another model?)")
        if len(array) == 0:
            raise InputError(f"{what} {number} has no token vectors (an empty text?); MaxSim needs at least one")
        if not np.isfinite(array).all():
            raise InputError(f"{what} {number}: the token vectors hold NaN or infinite values")
        arrays.append(array)
    return arrays


class MultiVectorIndexBuilder:
    """Streams documents' token vectors into ``directory``: ``add`` chunks, then ``finish``."""

    def __init__(self, directory: str | Path, dimension: int, *, dtype: str = "float32",
                 info: dict[str, Any] | None = None, show_progress: bool = False, **settings: Any) -> None:
        if dimension <= 0:
            raise InputError(f"the dimension must be positive, found {dimension}")
        if dtype not in DTYPES:
            raise InputError(f"token vectors are stored as {' or '.join(DTYPES)}, not {dtype!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in ("index.json", "index.faiss", "tokens.bin", "offsets.npy", "ids.txt", "ids.npy",
                      "ids.offsets.npy", "ids.bytes"):
            (self.directory / stale).unlink(missing_ok=True)
        self.dimension, self.dtype, self.info = dimension, dtype, dict(info or {})
        self.settings = MultiVectorSettings(**settings)
        self.show_progress = show_progress
        self._tokens = open(self.directory / "tokens.bin", "wb")
        self._offsets = [0]
        self._ids = _GrowingIds(self.directory)

    def add(self, documents: Sequence[np.ndarray], ids: Sequence[Any] | None = None) -> None:
        arrays = _check_documents(documents, self.dimension)
        if ids is not None and len(ids) != len(arrays):
            raise InputError(f"got {len(arrays)} documents but {len(ids)} ids")
        start = len(self._offsets) - 1
        self._ids.write([str(i) for i in ids] if ids is not None
                        else [str(i) for i in range(start, start + len(arrays))])
        for array in arrays:
            self._tokens.write(array.astype(self.dtype).tobytes())
            self._offsets.append(self._offsets[-1] + len(array))

    def finish(self) -> "MultiVectorIndex":
        count = len(self._offsets) - 1
        self._tokens.close()
        if count == 0:
            raise InputError("the corpus is empty: a multi-vector index needs at least one document")
        self._ids.close()
        offsets = np.asarray(self._offsets, np.int64)
        np.save(self.directory / "offsets.npy", offsets)
        total = int(offsets[-1])
        settings = self.settings
        if total >= settings.ivf_min_tokens:
            _build_ivf(self.directory, total, self.dimension, self.dtype, settings, self.show_progress)
        params = {"dimension": self.dimension, "dtype": self.dtype, "tokens": total,
                  "ivf": (self.directory / "index.faiss").is_file(), **settings.as_dict()}
        write_meta(self.directory, "multi-vector", count, params, self.info)
        return MultiVectorIndex.load(self.directory)


@dataclass
class MultiVectorSettings:
    nlist: int | None = None  # IVF lists (default: a power of two near 4 sqrt(tokens), 39 training vectors each)
    nprobe: int = 32
    codec: str = "sq8"
    token_candidates: int = 128  # nearest token vectors fetched per query token
    rerank_depth: int = 1000  # candidate documents scored exactly, at most
    ivf_min_tokens: int = 100_000  # below: no IVF, exact MaxSim over every document
    train_sample: int = 100_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise InputError(f"unknown IVF codec {self.codec!r}; choose one of {', '.join(CODECS)}")
        for name in ("nprobe", "token_candidates", "rerank_depth", "train_sample"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1, found {getattr(self, name)}")
        if self.nlist is not None and self.nlist < 1:
            raise InputError(f"nlist must be at least 1, found {self.nlist}")
        if self.ivf_min_tokens < 0:
            raise InputError(f"ivf_min_tokens must be 0 or more, found {self.ivf_min_tokens}")

    def as_dict(self) -> dict[str, Any]:
        return {"nlist": self.nlist, "nprobe": self.nprobe, "codec": self.codec,
                "token_candidates": self.token_candidates, "rerank_depth": self.rerank_depth,
                "ivf_min_tokens": self.ivf_min_tokens, "train_sample": self.train_sample, "seed": self.seed}


def _build_ivf(directory: Path, total: int, dimension: int, dtype: str, settings: MultiVectorSettings,
               show_progress: bool) -> None:
    from ..embeddings.compressed import MIN_POINTS_PER_CENTROID, default_nlist
    from ..embeddings.shards import sample_rows
    from ..progress import Progress

    faiss = faiss_module()
    width = np.dtype(dtype).itemsize * dimension
    with open(directory / "tokens.bin", "rb") as handle:
        rows = np.sort(sample_rows(total, settings.train_sample, settings.seed))
        sample = np.stack([np.frombuffer(os.pread(handle.fileno(), width, int(r) * width), dtype=dtype)
                           for r in rows]).astype(np.float32)
        if settings.nlist is None:
            settings.nlist = default_nlist(total, len(sample))
        if len(sample) < settings.nlist * MIN_POINTS_PER_CENTROID:
            raise InputError(f"an IVF of {settings.nlist} lists needs {settings.nlist * MIN_POINTS_PER_CENTROID:,} "
                             f"training token vectors ({MIN_POINTS_PER_CENTROID} per list); {len(sample):,} were "
                             "available: lower nlist or raise train_sample")
        codes = "Flat" if settings.codec == "flat" else "SQ8"
        index = faiss.index_factory(dimension, f"IVF{settings.nlist},{codes}", faiss.METRIC_INNER_PRODUCT)
        index.train(sample)
        del sample
        with Progress(total, "indexing token vectors (IVF)", "tokens", enabled=show_progress) as progress:
            for start in range(0, total, BLOCK_TOKENS):
                count = min(BLOCK_TOKENS, total - start)
                block = np.frombuffer(os.pread(handle.fileno(), count * width, start * width), dtype=dtype)
                index.add(np.ascontiguousarray(block.reshape(count, dimension), dtype=np.float32))
                progress.advance(count)
    faiss.write_index(index, str(directory / "index.faiss"))


@register_kind
@dataclass
class MultiVectorIndex:
    """A saved multi-vector index (see the module's docstring); build with ``build_multi_vector_index``."""

    directory: Path
    dimension: int
    dtype: str
    ids: Sequence[str]
    settings: MultiVectorSettings
    info: dict[str, Any] = field(default_factory=dict)
    exact: bool = False  # score every document exactly, even where an IVF exists
    kind = "multi-vector"

    def __post_init__(self) -> None:
        self.offsets = np.load(self.directory / "offsets.npy")
        total = int(self.offsets[-1])
        path = self.directory / "tokens.bin"
        if path.stat().st_size != total * self.dimension * np.dtype(self.dtype).itemsize:
            raise DataError(f"{path} does not hold {total:,} x {self.dimension} {self.dtype} token vectors")
        self.tokens = np.memmap(path, dtype=self.dtype, mode="r", shape=(total, self.dimension))
        self._ivf = None
        if (self.directory / "index.faiss").is_file():
            faiss = faiss_module()
            self._ivf = faiss.read_index(str(self.directory / "index.faiss"),
                                         getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP))

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def has_ivf(self) -> bool:
        return self._ivf is not None

    @classmethod
    def load(cls, directory: str | Path) -> "MultiVectorIndex":
        directory = Path(directory)
        meta = read_meta(directory, "multi-vector")
        params = meta["params"]
        for name in ("offsets.npy", "tokens.bin") + (("index.faiss",) if params.get("ivf") else ()):
            if not (directory / name).is_file():
                raise DataError(f"{directory}: {name} is missing")
        settings = MultiVectorSettings(**{key: params[key] for key in MultiVectorSettings().as_dict()})
        return cls(directory, int(params["dimension"]), params["dtype"], read_ids(directory, meta["count"]),
                   settings, meta.get("info", {}))

    def save(self, directory: str | Path) -> Path:
        return copy_directory(self.directory, Path(directory))

    # ----- scoring ------------------------------------------------------------------------------------------
    def maxsim(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Exact MaxSim of one query's token vectors with the documents ``rows`` (read from the stored vectors)."""
        out = np.empty(len(rows), np.float32)
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        position = 0
        while position < len(rows):  # blocks of about BLOCK_TOKENS token vectors
            lengths = ends[position:] - starts[position:]
            stop = position + max(1, int(np.searchsorted(np.cumsum(lengths), BLOCK_TOKENS, side="right")))
            block_starts, block_lengths = starts[position:stop], lengths[:stop - position]
            firsts = np.concatenate([[0], np.cumsum(block_lengths)[:-1]])
            token_rows = np.repeat(block_starts - firsts, block_lengths) + np.arange(int(block_lengths.sum()))
            tokens = np.asarray(self.tokens[token_rows], dtype=np.float32)
            similarity = query @ tokens.T
            out[position:stop] = np.maximum.reduceat(similarity, firsts, axis=1).sum(axis=0)
            position = stop
        return out

    def _exact(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """MaxSim over every document, in contiguous blocks of documents."""
        best_scores, best_rows = np.zeros(0, np.float32), np.zeros(0, np.int64)
        first = 0
        count = len(self.ids)
        while first < count:
            last = int(np.searchsorted(self.offsets, self.offsets[first] + BLOCK_TOKENS, side="right")) - 1
            last = min(max(last, first + 1), count)
            begin = int(self.offsets[first])
            tokens = np.asarray(self.tokens[begin:int(self.offsets[last])], dtype=np.float32)
            similarity = query @ tokens.T
            scores = np.maximum.reduceat(similarity, self.offsets[first:last] - begin, axis=1).sum(axis=0)
            best_scores, best_rows = top_k(np.concatenate([best_scores, scores]),
                                           np.concatenate([best_rows, np.arange(first, last)]), k)
            first = last
        return best_scores, best_rows

    def candidates(self, query: np.ndarray) -> np.ndarray:
        """The IVF's candidate documents of one query, at most ``rerank_depth``, best approximate score first."""
        faiss = faiss_module()
        settings = self.settings
        faiss.extract_index_ivf(self._ivf).nprobe = min(settings.nprobe, self._ivf.nlist)
        fetch = min(settings.token_candidates, self._ivf.ntotal)
        scores, labels = self._ivf.search(np.ascontiguousarray(query, dtype=np.float32), fetch)
        found = labels >= 0
        docs = np.searchsorted(self.offsets, labels[found], side="right") - 1
        query_token = np.nonzero(found)[0]
        values = scores[found]
        # per (document, query token): the best token fetched; summed over query tokens: the approximate score
        order = np.lexsort((-values, query_token, docs))
        docs, query_token, values = docs[order], query_token[order], values[order]
        first = np.ones(len(docs), bool)
        first[1:] = (docs[1:] != docs[:-1]) | (query_token[1:] != query_token[:-1])
        docs, values = docs[first], values[first]
        starts = np.flatnonzero(np.concatenate([[True], docs[1:] != docs[:-1]]))  # docs are sorted
        unique = docs[starts]
        approximate = np.add.reduceat(values, starts) if len(values) else np.zeros(0, np.float32)
        if len(unique) > settings.rerank_depth:
            _, unique = top_k(approximate.astype(np.float32), unique, settings.rerank_depth)
        return np.sort(unique)

    def search(self, queries: Sequence[np.ndarray], k: int = 10, *, model: str | None = None) -> SearchResult:
        """The k documents of highest MaxSim with each query (a list of (tokens, dimension) arrays)."""
        check_queries(self.kind, queries)
        check_model(self.info.get("model"), model)
        check_k(k)
        arrays = _check_documents(list(queries), self.dimension, "query")
        k = min(k, len(self.ids))
        results = []
        for query in arrays:
            if self._ivf is None or self.exact:
                results.append(self._exact(query, k))
                continue
            rows = self.candidates(query)
            results.append(top_k(self.maxsim(query, rows), rows, k) if len(rows) else
                           (np.zeros(0, np.float32), np.zeros(0, np.int64)))
        return padded_result(results, k, self.ids)


def build_multi_vector_index(chunks: Iterable[Sequence[np.ndarray]], directory: str | Path, *,
                             ids: Sequence[Any] | None = None, dtype: str = "float32",
                             info: dict[str, Any] | None = None, show_progress: bool = False,
                             **settings: Any) -> MultiVectorIndex:
    """Build a multi-vector index in ``directory`` from chunks of documents (each chunk a list of (tokens,
    dimension) arrays; a plain list of documents is one chunk). ``settings``: see ``MultiVectorSettings``."""
    if isinstance(chunks, (list, tuple)) and chunks and getattr(chunks[0], "ndim", None) == 2:
        chunks = [chunks]  # a list of documents, not of chunks
    builder: MultiVectorIndexBuilder | None = None
    done = 0
    for chunk in chunks:
        if not len(chunk):
            continue
        if builder is None:
            first = np.asarray(chunk[0])
            if first.ndim != 2:
                raise InputError(f"document 0: token vectors must be a (tokens, dimension) array, found shape "
                                 f"{first.shape}")
            builder = MultiVectorIndexBuilder(directory, first.shape[1], dtype=dtype, info=info,
                                              show_progress=show_progress, **settings)
        chunk_ids = None if ids is None else ids[done:done + len(chunk)]
        builder.add(chunk, chunk_ids)
        done += len(chunk)
    if builder is None:
        raise InputError("the corpus is empty: a multi-vector index needs at least one document")
    if ids is not None and done != len(ids):
        raise InputError(f"got {done} documents but {len(ids)} ids")
    return builder.finish()
