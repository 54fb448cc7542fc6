"""Semantic search: an exact index (chunked matrix products) and approximate indexes from FAISS.

``ExactIndex`` keeps float32 vectors and scans them in chunks, so memory beyond the vectors stays
bounded. ``ApproximateIndex`` wraps FAISS: "hnsw" (a graph: fast queries on real embeddings, whose
neighbourhoods have structure) or "sq8" (8-bit scalar quantisation: 4x less memory, a full scan;
it keeps recall on data without structure, where graphs fail). The choice is measured in
BENCHMARKS.md. Indexes save to and load from a directory, giving identical results.

The compressed kinds for corpora larger than memory (IVF-PQ, int8, binary; streamed builds, memory-
mapped search, float rescoring) live in ``embeddings/compressed.py``; ``build_index`` and
``VectorIndex.load`` serve all kinds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import DataError, InputError
from ..extras import faiss_module

METRICS = ("cosine", "ip")
KINDS = ("exact", "hnsw", "sq8", "ivfpq", "int8", "binary")


@dataclass
class SearchResult:
    scores: np.ndarray  # (queries, k), best first
    indices: np.ndarray  # (queries, k) row numbers in the index; -1 where fewer than k exist
    ids: list[list[str]]


@dataclass
class VectorIndex:
    dimension: int
    metric: str = "cosine"
    ids: Sequence[str] = field(default_factory=list)  # a list, or a memory-mapped IdColumn once loaded
    info: dict[str, Any] = field(default_factory=dict)  # free-form facts saved with the index (model, source)
    kind = "base"

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise InputError(f"unknown metric {self.metric!r}; choose one of {', '.join(METRICS)}")
        if self.dimension <= 0:
            raise InputError(f"dimension must be positive, found {self.dimension}")

    def __len__(self) -> int:
        return len(self.ids)

    def _prepare(self, vectors: np.ndarray | torch.Tensor, what: str) -> np.ndarray:
        array = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
        if array.ndim == 1:
            array = array[None, :]
        if array.ndim != 2 or array.shape[1] != self.dimension:
            raise InputError(f"{what} must have shape (n, {self.dimension}), found {tuple(array.shape)}")
        if not np.isfinite(array).all():
            raise InputError(f"{what} hold NaN or infinite values")
        if self.metric == "cosine":
            array = array / np.maximum(np.linalg.norm(array, axis=1, keepdims=True), 1e-12)
        return array

    def add(self, vectors: np.ndarray | torch.Tensor, ids: Sequence[str] | None = None) -> None:
        array = self._prepare(vectors, "vectors")
        if ids is None:
            ids = [str(i) for i in range(len(self.ids), len(self.ids) + len(array))]
        if len(ids) != len(array):
            raise InputError(f"got {len(array)} vectors but {len(ids)} ids")
        self._add(array)
        if not isinstance(self.ids, list):
            self.ids = list(self.ids)
        self.ids.extend(str(i) for i in ids)

    def search(self, queries: np.ndarray | torch.Tensor, k: int = 10) -> SearchResult:
        if k <= 0:
            raise InputError(f"k must be positive, found {k}")
        if not self.ids:
            raise InputError("the index is empty; add vectors first")
        array = self._prepare(queries, "queries")
        scores, indices = self._search(array, min(k, len(self.ids)))
        ids = [[self.ids[i] for i in row if i >= 0] for row in indices]
        return SearchResult(scores, indices, ids)

    # ----- persistence ------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._save_data(directory)
        self._save_ids(directory)
        self._write_meta(directory, len(self.ids))
        return directory

    def _write_meta(self, directory: Path, count: int) -> None:
        meta = {"kind": self.kind, "dimension": self.dimension, "metric": self.metric, "count": count,
                "params": self._params(), "info": self.info}
        (directory / "index.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")

    @staticmethod
    def load(directory: str | Path) -> "VectorIndex":
        directory = Path(directory)
        meta_path = directory / "index.json"
        if not meta_path.is_file():
            raise DataError(f"{directory} is not a saved index (no index.json); build one with `encoderkit index`")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        kind = meta.get("kind")
        if kind not in KINDS:
            raise DataError(f"{meta_path}: unknown index kind {kind!r}")
        cls = _index_class(kind)
        params = dict(meta.get("params", {}))
        if cls is not ExactIndex:
            params["kind"] = kind
        index = cls(dimension=meta["dimension"], metric=meta["metric"], info=meta.get("info", {}), **params)
        index._load_data(directory)
        index.ids = index._load_ids(directory)
        if len(index.ids) != meta["count"]:
            raise DataError(f"{directory}: the index has {len(index.ids)} ids, index.json says {meta['count']}")
        return index

    # ----- for subclasses ---------------------------------------------------------------------
    def _add(self, array: np.ndarray) -> None: raise NotImplementedError
    def _search(self, array: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: raise NotImplementedError
    def _save_data(self, directory: Path) -> None: raise NotImplementedError
    def _load_data(self, directory: Path) -> None: raise NotImplementedError
    def _params(self) -> dict[str, Any]: return {}

    def _save_ids(self, directory: Path) -> None:
        (directory / "ids.txt").write_text("".join(i.replace("\n", " ") + "\n" for i in self.ids), encoding="utf-8")

    def _load_ids(self, directory: Path) -> Sequence[str]:
        return (directory / "ids.txt").read_text(encoding="utf-8").splitlines()


# kind -> its VectorIndex class: each registers itself (``register_index``). The compressed kinds live in
# ``embeddings/compressed.py``, which imports this module; the package imports it, so it is registered before any
# index is built or loaded, and this module imports none of its index kinds (no import cycle).
INDEX_CLASSES: dict[str, type] = {}


def register_index(*kinds: str):
    """Class decorator: ``build_index`` and ``VectorIndex.load`` make indexes of ``kinds`` with the class."""
    def register(cls: type) -> type:
        INDEX_CLASSES.update(dict.fromkeys(kinds, cls))
        return cls

    return register


def _index_class(kind: str) -> type[VectorIndex]:
    if kind not in INDEX_CLASSES:
        raise InputError(f"unknown index kind {kind!r}; choose one of {', '.join(KINDS)}")
    return INDEX_CLASSES[kind]


@register_index("exact")
@dataclass
class ExactIndex(VectorIndex):
    """Brute force: scores = queries @ vectors.T, scanned ``chunk_rows`` rows at a time."""

    chunk_rows: int = 65536
    kind = "exact"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._chunks: list[np.ndarray] = []
        self._matrix: np.ndarray | None = None

    @property
    def vectors(self) -> np.ndarray:
        if self._matrix is None or len(self._chunks) > 1:
            self._matrix = np.concatenate(self._chunks) if self._chunks else np.zeros((0, self.dimension), np.float32)
            self._chunks = [self._matrix]
        return self._matrix

    def _add(self, array: np.ndarray) -> None:
        self._chunks.append(array)
        self._matrix = None

    def _search(self, array: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        matrix = torch.from_numpy(self.vectors)
        queries = torch.from_numpy(array)
        best_scores = torch.full((len(array), k), -torch.inf)
        best_indices = torch.full((len(array), k), -1, dtype=torch.long)
        for start in range(0, matrix.shape[0], self.chunk_rows):
            scores = queries @ matrix[start:start + self.chunk_rows].T
            top = scores.topk(min(k, scores.shape[1]), dim=1)
            merged_scores = torch.cat([best_scores, top.values], dim=1)
            merged_indices = torch.cat([best_indices, top.indices + start], dim=1)
            keep = merged_scores.topk(k, dim=1)
            best_scores, best_indices = keep.values, merged_indices.gather(1, keep.indices)
        return best_scores.numpy(), best_indices.numpy()

    def _save_data(self, directory: Path) -> None:
        np.save(directory / "vectors.npy", self.vectors)

    def _load_data(self, directory: Path) -> None:
        self._chunks = [np.load(directory / "vectors.npy", mmap_mode="r")]
        self._matrix = None

    def _params(self) -> dict[str, Any]:
        return {"chunk_rows": self.chunk_rows}


@register_index("hnsw", "sq8")
@dataclass
class ApproximateIndex(VectorIndex):
    """FAISS HNSW (``connectivity``, ``ef_construction``, ``ef_search``) or 8-bit scalar quantisation."""

    kind: str = "hnsw"  # type: ignore[assignment]
    connectivity: int = 32
    ef_construction: int = 200
    ef_search: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind not in ("hnsw", "sq8"):
            raise InputError(f"approximate index kind must be 'hnsw' or 'sq8', found {self.kind!r}")
        faiss = faiss_module()
        if self.kind == "hnsw":
            self._index = faiss.IndexHNSWFlat(self.dimension, self.connectivity, faiss.METRIC_INNER_PRODUCT)
            self._index.hnsw.efConstruction = self.ef_construction
        else:
            self._index = faiss.IndexScalarQuantizer(self.dimension, faiss.ScalarQuantizer.QT_8bit,
                                                     faiss.METRIC_INNER_PRODUCT)

    def _add(self, array: np.ndarray) -> None:
        if not self._index.is_trained:
            self._index.train(array)  # sq8 learns each dimension's range from the first vectors added
        self._index.add(array)

    def _search(self, array: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.kind == "hnsw":
            self._index.hnsw.efSearch = max(self.ef_search, k)
        scores, indices = self._index.search(array, k)
        return scores, indices

    def _save_data(self, directory: Path) -> None:
        faiss_module().write_index(self._index, str(directory / "index.faiss"))

    def _load_data(self, directory: Path) -> None:
        self._index = faiss_module().read_index(str(directory / "index.faiss"))

    def _params(self) -> dict[str, Any]:
        return {"connectivity": self.connectivity, "ef_construction": self.ef_construction,
                "ef_search": self.ef_search}


def build_index(vectors: np.ndarray, ids: Sequence[str] | None = None, *, kind: str = "exact",
                metric: str = "cosine", **params: Any) -> VectorIndex:
    if kind not in KINDS:
        raise InputError(f"unknown index kind {kind!r}; choose one of {', '.join(KINDS)}")
    array = np.asarray(vectors)
    if array.ndim != 2:
        raise InputError(f"vectors must be a 2-D array, found shape {array.shape}")
    cls = _index_class(kind)
    index = (ExactIndex(array.shape[1], metric, **params) if cls is ExactIndex
             else cls(array.shape[1], metric, kind=kind, **params))
    if hasattr(index, "train_on_sample") and len(array):  # compressed kinds: on a seeded sample of all the vectors
        index.train_on_sample(array)
    for start in range(0, len(array), 65536):  # bounded extra memory for a memory-mapped input
        index.add(array[start:start + 65536], None if ids is None else ids[start:start + 65536])
    return index
