"""Texts in, indexes out: the CLI's glue between files of texts, the encoders and the retrieval indexes.

The sparse kind encodes with ``encoderkit.embeddings.sparse.SparseEmbedder`` (documents with ``encode_document``,
queries with ``encode_query`` where it has them), the multi-vector kind with
``encoderkit.embeddings.multi_vector.MultiVectorEmbedder`` (``encode(texts, is_query=...)``); either import fails
as one InputError where that module is missing. The index records the model's resolved directory, so that a
search encodes its queries with the same model.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ..errors import InputError
from .base import DENSE_KINDS

ENCODE_CHUNK = 4096  # texts encoded, then added to a streamed index, at a time


ENCODERS = {"sparse": ("sparse", "SparseEmbedder"), "multi-vector": ("multi_vector", "MultiVectorEmbedder")}


def embedder_for(kind: str, model: str | Path | None):
    """The encoder of a sparse (SparseEmbedder) or multi-vector (MultiVectorEmbedder) index, loaded from ``model``."""
    import importlib

    module, name = ENCODERS[kind]
    try:
        cls = getattr(importlib.import_module(f"encoderkit.embeddings.{module}"), name)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"{kind} indexes need encoderkit.embeddings.{module}.{name}, which this installation "
                         f"lacks: {exc}") from exc
    return cls.from_pretrained(model)


def model_root(model: str | Path | None) -> str:
    """The directory a model name resolves to: what an index records and compares."""
    from ..io.hub import resolve_model

    return str(resolve_model(model).root)


def _encode_documents(embedder: Any, texts: Sequence[str]):
    encode = getattr(embedder, "encode_document", None) or embedder.encode
    return encode(list(texts))


def _encode_query_texts(embedder: Any, texts: Sequence[str]):
    encode = getattr(embedder, "encode_query", None) or embedder.encode
    return encode(list(texts))


def chunks_of(records: Iterable[Any], size: int = ENCODE_CHUNK) -> Iterator[tuple[list[str], list[str]]]:
    """(ids, texts) of ``size`` records at a time."""
    ids: list[str] = []
    texts: list[str] = []
    for record in records:
        ids.append(record.id)
        texts.append(record.text)
        if len(texts) == size:
            yield ids, texts
            ids, texts = [], []
    if texts:
        yield ids, texts


def build_from_texts(kind: str, records: Iterable[Any], out_dir: str | Path, *, model: str | Path | None = None,
                     info: dict[str, Any] | None = None, show_progress: bool = True, **settings: Any):
    """A bm25, sparse or multi-vector index of ``records`` (objects with ``id`` and ``text``, e.g. from
    ``data.readers.iter_records``) saved in ``out_dir``; sparse and multi-vector encode and add ``ENCODE_CHUNK``
    texts at a time."""
    from ..progress import Progress

    info = dict(info or {})
    if kind == "bm25":
        from .bm25 import BM25Index

        if model is not None:
            raise InputError("a bm25 index scores the texts themselves: it takes no --model")
        ids, texts = [], []
        for record in records:
            ids.append(record.id)
            texts.append(record.text)
        index = BM25Index.build(texts, ids, info=info, **settings)
        index.save(out_dir)
        return index
    if kind not in ("sparse", "multi-vector"):
        raise InputError(f"build_from_texts builds bm25, sparse and multi-vector indexes, not {kind}")
    embedder = embedder_for(kind, model)
    info["model"] = model_root(model)
    with Progress(None, f"encoding and indexing ({kind})", "texts", enabled=show_progress) as progress:
        def encoded() -> Iterator[Any]:
            for ids, texts in chunks_of(records):
                vectors = (_encode_documents(embedder, texts) if kind == "sparse"
                           else embedder.encode(texts, is_query=False))
                progress.advance(len(texts))
                yield ids, vectors

        if kind == "sparse":
            from .sparse_index import SparseIndexBuilder

            builder = None
            for ids, vectors in encoded():
                if builder is None:
                    builder = SparseIndexBuilder(out_dir, vectors.dimension, info=info, show_progress=show_progress,
                                                 **settings)
                builder.add(vectors, ids)
        else:
            from .multi_vector import MultiVectorIndexBuilder

            builder = None
            dtype = settings.pop("dtype", "float32")
            for ids, vectors in encoded():
                if builder is None:
                    builder = MultiVectorIndexBuilder(out_dir, int(vectors[0].shape[1]), dtype=dtype, info=info,
                                                      show_progress=show_progress, **settings)
                builder.add(vectors, ids)
    if builder is None:
        raise InputError(f"the corpus is empty: a {kind} index needs at least one text")
    return builder.finish()


def encode_queries(index: Any, texts: Sequence[str], *, dense_embedder: Callable[[Any], Any] | None = None,
                   prompt: str | None = None, prompt_name: str | None = None) -> Any:
    """The queries ``index`` searches with, from ``texts``, encoded by the model it records (its parts' models
    for a hybrid index). ``dense_embedder(index)``: the Embedder for a dense index (default: its recorded model);
    ``prompt`` / ``prompt_name`` go to dense embedders."""
    kind = index.kind
    if kind == "bm25":
        return list(texts)
    if kind == "hybrid":
        return {name: encode_queries(part, texts, dense_embedder=dense_embedder, prompt=prompt,
                                     prompt_name=prompt_name)
                for name, part in index.parts.items()}
    model = index.info.get("model")
    if kind == "sparse":
        return _encode_query_texts(embedder_for(kind, model), texts)
    if kind == "multi-vector":
        return embedder_for(kind, model).encode(list(texts), is_query=True)
    if kind in DENSE_KINDS:
        if dense_embedder is not None:
            embedder = dense_embedder(index)
        else:
            from ..tasks.embed import Embedder

            embedder = Embedder.from_pretrained(model, truncate_dim=index.info.get("truncate_dim"))
        return embedder.encode(list(texts), prompt=prompt, prompt_name=prompt_name)
    raise InputError(f"unknown index kind {kind!r}")


def evaluate_kind(kind: str, queries: Mapping[str, str], corpus: Mapping[str, str],
                  qrels: Mapping[str, Any], *, model: str | None = None, second: str = "bm25",
                  second_model: str | None = None, fusion: str = "rrf", k_rrf: float = 60.0,
                  weights: Sequence[float] | None = None, batch_size: int = 64,
                  ks: Mapping[str, Iterable[int]] | None = None, show_progress: bool = False,
                  **settings: Any) -> dict[str, float]:
    """``retrieval_metrics`` of a bm25, sparse, multi-vector or hybrid index of ``corpus`` (built in a temporary
    directory) searched with ``queries``. hybrid: a dense exact index of ``model`` fused with ``second`` (bm25, or
    sparse with ``second_model``), ``weights`` in that order."""
    from ..embeddings.evaluation import _check_ids, _grades, _normalise_ks, retrieval_metrics
    from ..errors import DataError
    from ..data.readers import Record

    ks = _normalise_ks(ks)
    _check_ids(queries, corpus, qrels)
    query_ids = [qid for qid in queries
                 if qid in qrels and any(grade > 0 for grade in _grades(qrels[qid], qid).values())]
    if not query_ids:
        raise DataError("no query has a relevant document in the qrels; nothing to evaluate")
    records = [Record(doc, text) for doc, text in corpus.items()]
    depth = max(k for values in ks.values() for k in values)
    with tempfile.TemporaryDirectory(prefix="encoderkit-eval-") as tmp:
        if kind == "hybrid":
            from ..tasks.embed import Embedder
            from ..tasks.search import build_index
            from .hybrid import HybridIndex

            if second not in ("bm25", "sparse"):
                raise InputError(f"a hybrid evaluation fuses dense with bm25 or sparse, not {second!r}")
            embedder = Embedder.from_pretrained(model)
            dense = build_index(embedder.encode(list(corpus.values()), batch_size=batch_size, normalize=True),
                                list(corpus), metric="ip")
            dense.info = {"model": model_root(model)}
            other = build_from_texts(second, records, Path(tmp) / second, model=second_model,
                                     show_progress=show_progress, **settings)
            index = HybridIndex({"dense": dense, second: other}, fusion=fusion, k_rrf=k_rrf, depth=max(depth, 100),
                                weights=None if weights is None else dict(zip(["dense", second], weights)))
            texts = [queries[q] for q in query_ids]
            found = index.search({"dense": embedder.encode(texts, batch_size=batch_size, normalize=True),
                                  second: encode_queries(other, texts)}, depth)
        else:
            if kind not in ("bm25", "sparse", "multi-vector"):
                raise InputError(f"evaluate_kind takes bm25, sparse, multi-vector or hybrid, not {kind!r}")
            index = build_from_texts(kind, records, Path(tmp) / kind, model=model, show_progress=show_progress,
                                     **settings)
            found = index.search(encode_queries(index, [queries[q] for q in query_ids]), depth)
        rankings = {qid: found.ids[row] for row, qid in enumerate(query_ids)}
    return retrieval_metrics(rankings, {qid: qrels[qid] for qid in query_ids}, ks)
