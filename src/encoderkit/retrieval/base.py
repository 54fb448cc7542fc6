"""What every retrieval index shares: its ``index.json`` (kind, model, settings), its ids, the checks that refuse
queries of another kind or model, and a deterministic top-k.

Every index directory holds ``index.json`` as the dense indexes of ``tasks/search.py`` do: ``kind``, ``count``,
``params`` (the settings it was built with) and ``info`` (free-form facts; ``info["model"]`` is the encoder whose
queries it takes: None for BM25). ``load_index`` reads any kind, dense ones included.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import DataError, InputError
from ..tasks.search import KINDS as DENSE_KINDS
from ..tasks.search import SearchResult, VectorIndex

RETRIEVAL_KINDS = ("bm25", "sparse", "multi-vector", "hybrid")
ALL_KINDS = DENSE_KINDS + RETRIEVAL_KINDS

# what each kind takes as queries, said in the error that refuses another kind's
QUERY_TYPES = {"dense": "a (queries, dimension) float array from a dense embedder (Embedder.encode)",
               "bm25": "query texts (a list of strings)",
               "sparse": "SparseVectors (SparseEmbedder.encode)",
               "multi-vector": "a list of (tokens, dimension) float arrays, one per query "
                               "(MultiVectorEmbedder.encode(..., is_query=True))",
               "hybrid": "a dict of each part's queries, by part name"}


def query_kind(queries: Any) -> str:
    """The kind of index ``queries`` are for, judged by their type (see QUERY_TYPES)."""
    from ..embeddings.sparse_vectors import SparseVectors

    if isinstance(queries, SparseVectors):
        return "sparse"
    if isinstance(queries, str):
        return "bm25"
    if isinstance(queries, dict):
        return "hybrid"
    if isinstance(queries, np.ndarray) or hasattr(queries, "numpy"):
        return "multi-vector" if getattr(queries, "ndim", 0) == 3 else "dense"
    if isinstance(queries, (list, tuple)) and queries:
        first = queries[0]
        if isinstance(first, str):
            return "bm25"
        if getattr(first, "ndim", None) == 2:
            return "multi-vector"
        if getattr(first, "ndim", None) == 1 or isinstance(first, (list, tuple)):
            return "dense"
    return "unknown"


def check_queries(kind: str, queries: Any, where: str = "this index") -> None:
    """One InputError when ``queries`` are not what an index of ``kind`` searches with."""
    index_kind = "dense" if kind in DENSE_KINDS else kind
    found = query_kind(queries)
    if found != index_kind:
        what = {"unknown": f"{type(queries).__name__}"}.get(found, f"queries for a {found} index")
        raise InputError(f"{where} is a {kind} index: it takes {QUERY_TYPES[index_kind]}, but was given {what}; "
                         f"encode the queries the way its documents were (or search an index of the other kind)")


def check_model(recorded: str | None, given: str | None, where: str = "this index") -> None:
    """Refuses queries encoded by another model than the one the index was built with (both named)."""
    if given is None or recorded is None:
        return
    if _same_model(recorded, given):
        return
    raise InputError(f"{where} was built with the model {recorded}, but the queries come from {given}: their "
                     f"vectors do not compare; encode the queries with {recorded} (or rebuild the index with {given})")


def _same_model(a: str, b: str) -> bool:
    if str(a) == str(b):
        return True
    pa, pb = Path(str(a)), Path(str(b))
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def top_k(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (score, row) pairs, by descending score, ties by ascending row, whatever order they came in."""
    if len(scores) > k:
        part = np.argpartition(-scores, k - 1)[:k]
        keep = np.flatnonzero(scores >= scores[part].min())  # with every tie at the k-th score
        scores, rows = scores[keep], rows[keep]
    order = np.lexsort((rows, -scores))[:k]
    return scores[order], rows[order]


def padded_result(per_query: Sequence[tuple[np.ndarray, np.ndarray]], k: int, ids: Sequence[str]) -> SearchResult:
    """One SearchResult from each query's (scores, rows), padded to k with -inf and row -1."""
    scores = np.full((len(per_query), k), -np.inf, dtype=np.float32)
    rows = np.full((len(per_query), k), -1, dtype=np.int64)
    for q, (s, r) in enumerate(per_query):
        scores[q, :len(s)], rows[q, :len(r)] = s, r
    return SearchResult(scores, rows, [[ids[int(i)] for i in row if i >= 0] for row in rows])


def check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
        raise InputError(f"k must be a positive integer, found {k!r}")


# ----- index.json and ids ------------------------------------------------------------------------------------
def write_meta(directory: Path, kind: str, count: int, params: dict[str, Any], info: dict[str, Any]) -> None:
    meta = {"kind": kind, "count": count, "params": params, "info": info}
    (directory / "index.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def read_meta(directory: str | Path, kind: str | None = None) -> dict[str, Any]:
    directory = Path(directory)
    path = directory / "index.json"
    if not path.is_file():
        raise DataError(f"{directory} is not a saved index (no index.json); build one with `encoderkit index`")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} is not valid JSON: {exc}") from exc
    if meta.get("kind") not in ALL_KINDS:
        raise DataError(f"{path}: unknown index kind {meta.get('kind')!r}")
    if kind is not None and meta["kind"] != kind:
        raise InputError(f"{directory} is a {meta['kind']} index, not a {kind} one: load it with "
                         f"encoderkit.retrieval.load_index")
    return meta


def write_ids(directory: Path, ids: Sequence[str]) -> None:
    from ..embeddings.compressed import IdWriter

    for stale in ("ids.txt", "ids.npy", "ids.offsets.npy", "ids.bytes"):
        (directory / stale).unlink(missing_ok=True)
    writer = IdWriter(directory, len(ids), "string")
    for start in range(0, len(ids), 65536):
        writer.write(list(ids[start:start + 65536]))
    writer.close()


def read_ids(directory: Path, count: int) -> Sequence[str]:
    from ..embeddings.compressed import IdColumn

    ids = IdColumn(directory)
    if len(ids) != count:
        raise DataError(f"{directory}: the index has {len(ids)} ids, index.json says {count}")
    return ids


def default_ids(count: int, ids: Sequence[Any] | None, what: str = "documents") -> list[str]:
    if ids is None:
        return [str(i) for i in range(count)]
    if len(ids) != count:
        raise InputError(f"got {count} {what} but {len(ids)} ids")
    return [str(i) for i in ids]


def copy_directory(source: Path, target: Path) -> Path:
    """A directory-backed index saved elsewhere: its files copied (nothing to do where they already are)."""
    target = Path(target)
    if target.exists() and target.resolve() == source.resolve():
        return target
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_dir():
            shutil.copytree(path, target / path.name, dirs_exist_ok=True)
        else:
            shutil.copy2(path, target / path.name)
    return target


# kind -> the class that loads it (``cls.load(directory)``): each retrieval kind's module registers itself when
# imported (``register_kind``), and the package imports them all, so base imports none of them (no import cycle)
LOADERS: dict[str, Any] = {}


def register_kind(cls: Any) -> Any:
    """Class decorator: ``load_index`` opens directories of ``cls.kind`` with ``cls.load``."""
    LOADERS[cls.kind] = cls
    return cls


def load_index(directory: str | Path):
    """Any saved index: a dense one (``VectorIndex.load``) or a bm25, sparse, multi-vector or hybrid one."""
    meta = read_meta(directory)
    kind = meta["kind"]
    if kind in DENSE_KINDS:
        return VectorIndex.load(directory)
    if kind not in LOADERS:
        raise DataError(f"{directory}: index kind {kind!r} is unknown to this encoderkit ({', '.join(ALL_KINDS)})")
    return LOADERS[kind].load(directory)


def index_model(index: Any) -> str | None:
    return (getattr(index, "info", None) or {}).get("model")


def search_any(index: Any, queries: Any, k: int, *, model: str | None = None,
               where: str = "this index") -> SearchResult:
    """Search an index of any kind, checking the queries' kind and model first."""
    kind = index.kind
    if kind in DENSE_KINDS:
        check_queries(kind, queries, where)
        check_model(index_model(index), model, where)
        return index.search(queries, k)
    return index.search(queries, k, model=model)
