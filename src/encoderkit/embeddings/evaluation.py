"""Evaluating sentence embedders: information retrieval (MRR, nDCG, Recall, MAP), STS Spearman, triplet accuracy.

Retrieval metrics follow the definitions of sentence-transformers' InformationRetrievalEvaluator:

- a ranking is ordered by descending score, ties broken by ascending document id;
- only queries with at least one relevant document (grade > 0) are evaluated;
- MRR@k: 1 / rank of the first relevant document within the top k (0 if none);
- nDCG@k: DCG = sum over the top k of gain / log2(rank + 1), divided by the DCG of the ideal ranking; the gain
  is 1 for a relevant document (binary) or its grade when graded qrels are given;
- Recall@k: relevant documents in the top k / relevant documents;
- MAP@k: sum of precision@rank at each relevant rank within the top k, divided by min(k, relevant documents).

Files: queries and corpus are ``id<TAB>text``; qrels are ``query_id<TAB>doc_id[<TAB>grade]``. A header line is
optional and recognised by its field names. Malformed input raises a DataError naming the file and line.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import torch

from ..data.readers import _lines
from ..errors import DataError, InputError
from ..modeling.packing import MAX_BATCH_SIZE

DEFAULT_KS: dict[str, tuple[int, ...]] = {"ndcg": (10,), "mrr": (10,), "recall": (1, 10, 100), "map": (100,)}
"""The cut-offs reported by default, in the order printed: nDCG@10 first."""

_ID_NAMES = frozenset({"id", "_id", "qid", "query_id", "query-id", "queryid", "query", "doc_id", "doc-id", "docid",
                       "did", "pid", "corpus_id", "corpus-id", "corpusid", "passage_id", "document_id"})
_TEXT_NAMES = frozenset({"text", "query", "question", "passage", "document", "doc", "body", "content", "title",
                         "sentence"})
_GRADE_NAMES = frozenset({"grade", "score", "relevance", "rel", "label"})


# ---------------------------------------------------------------------------------------------------- metrics

def _normalise_ks(ks: Mapping[str, Iterable[int]] | None) -> dict[str, tuple[int, ...]]:
    ks = DEFAULT_KS if ks is None else ks
    unknown = sorted(set(ks) - set(DEFAULT_KS))
    if unknown:
        raise InputError(f"unknown retrieval metric(s) {unknown}; choose from {', '.join(DEFAULT_KS)}")
    result = {}
    for name, values in ks.items():
        values = tuple(values)
        for k in values:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
                raise InputError(f"cut-offs must be positive integers, found {k!r} for {name}")
        result[name] = tuple(int(k) for k in values)
    return result


def _grades(relevant: Mapping[str, float] | Iterable[str], qid: str) -> dict[str, float]:
    """qrels of one query as {doc id: grade}; a set (or any iterable of ids) means grade 1 each."""
    if isinstance(relevant, Mapping):
        grades = {}
        for doc, grade in relevant.items():
            if isinstance(grade, bool) or not isinstance(grade, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(grade):
                raise InputError(f"qrels grade of query {qid!r}, document {doc!r} must be a finite number, "
                                 f"found {grade!r}")
            grades[doc] = float(grade)
        return grades
    if isinstance(relevant, str):
        raise InputError(f"qrels of query {qid!r} must be a set of document ids or a dict of grades, found a string")
    return {doc: 1.0 for doc in relevant}


def _ranked_ids(entry: Mapping[str, float] | Sequence[str]) -> list[str]:
    """A ranking (ids, best first) as given, or ids ordered by descending score, ties by ascending id."""
    if isinstance(entry, Mapping):
        return [doc for doc, _ in sorted(entry.items(), key=lambda item: (-float(item[1]), item[0]))]
    if isinstance(entry, str):
        raise InputError("a ranking must be a sequence of document ids or a dict of scores, found a string")
    return list(entry)


def _dcg(gains: Sequence[float]) -> float:
    return sum(gain / math.log2(rank + 1) for rank, gain in enumerate(gains, start=1))


def retrieval_metrics(scores_or_rankings: Mapping[str, Mapping[str, float] | Sequence[str]],
                      qrels: Mapping[str, Mapping[str, float] | Iterable[str]],
                      ks: Mapping[str, Iterable[int]] | None = None) -> dict[str, float]:
    """MRR@k, nDCG@k, Recall@k and MAP@k averaged over the queries of ``qrels`` that have a relevant document.

    ``scores_or_rankings``: query id -> document ids ranked best first, or -> {document id: score} (ranked by
    descending score, ties by ascending id). A query without an entry has an empty ranking.
    ``qrels``: query id -> set of relevant document ids (binary), or -> {document id: grade} (graded: the gain of
    nDCG is the grade; a grade <= 0 is not relevant). ``ks``: metric -> cut-offs, default ``DEFAULT_KS``
    (ndcg@10, mrr@10, recall@1/10/100, map@100). Returns {"ndcg@10": ..., "mrr@10": ..., ...} in that order.
    """
    ks = _normalise_ks(ks)
    sums = {f"{name}@{k}": 0.0 for name, values in ks.items() for k in values}
    evaluated = 0
    for qid, relevant in qrels.items():
        grades = {doc: grade for doc, grade in _grades(relevant, qid).items() if grade > 0}
        if not grades:
            continue
        evaluated += 1
        ranking = _ranked_ids(scores_or_rankings.get(qid, ()))
        hits = [doc in grades for doc in ranking]
        for k in ks.get("mrr", ()):
            first = next((rank for rank, hit in enumerate(hits[:k], start=1) if hit), None)
            sums[f"mrr@{k}"] += 1.0 / first if first else 0.0
        for k in ks.get("ndcg", ()):
            ideal = _dcg(sorted(grades.values(), reverse=True)[:k])
            sums[f"ndcg@{k}"] += _dcg([grades.get(doc, 0.0) for doc in ranking[:k]]) / ideal
        for k in ks.get("recall", ()):
            sums[f"recall@{k}"] += sum(hits[:k]) / len(grades)
        for k in ks.get("map", ()):
            found, precision_sum = 0, 0.0
            for rank, hit in enumerate(hits[:k], start=1):
                if hit:
                    found += 1
                    precision_sum += found / rank
            sums[f"map@{k}"] += precision_sum / min(k, len(grades))
    if not evaluated:
        raise DataError("no query has a relevant document in the qrels; nothing to evaluate")
    return {name: total / evaluated for name, total in sums.items()}


# ---------------------------------------------------------------------------------------------------- search

def _check_ids(queries: Mapping[str, str], corpus: Mapping[str, str], qrels: Mapping) -> None:
    if not queries:
        raise DataError("the queries are empty")
    if not corpus:
        raise DataError("the corpus is empty")
    for what, texts in (("query", queries), ("document", corpus)):
        for key, text in texts.items():
            if not isinstance(text, str) or not text.strip():
                raise DataError(f"{what} {key!r} has an empty text")
    for qid, relevant in qrels.items():
        if qid not in queries:
            raise DataError(f"qrels query id {qid!r} is not among the queries")
        for doc in _grades(relevant, qid):
            if doc not in corpus:
                raise DataError(f"qrels document id {doc!r} (query {qid!r}) is not in the corpus")


def _merge_top(values: np.ndarray, indices: np.ndarray, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k best (value, index) pairs ordered by descending value, then ascending ``keys[index]``.
    Empty slots hold value -inf and index -1 (their key sorts last)."""
    tie_key = np.where(indices >= 0, keys[np.maximum(indices, 0)], np.iinfo(np.int64).max)
    order = np.lexsort((tie_key, -values.astype(np.float64)), axis=-1)[:, :k]
    return np.take_along_axis(values, order, axis=1), np.take_along_axis(indices, order, axis=1)


def _chunk_top(scores: torch.Tensor, id_ranks: torch.Tensor, k: int, n_corpus: int) -> torch.Tensor:
    """Per row, the indices of the k highest scores; where several tie at the k-th score, those whose ids sort
    first are kept, so the result does not depend on how the corpus is chunked."""
    values, indices = torch.topk(scores, k, dim=1)
    cutoff = values[:, -1:]
    tied = (scores >= cutoff).sum(dim=1) > k
    if tied.any():
        rows = tied.nonzero().squeeze(1)
        sub, sub_cutoff = scores[rows], cutoff[rows]
        n = n_corpus  # id ranks are below it
        # above the cut-off: the id rank (< n: all of them are kept); at it: n + id rank; below: 2n
        key = torch.where(sub > sub_cutoff, id_ranks, torch.where(sub == sub_cutoff, id_ranks + n, 2 * n))
        indices[rows] = torch.topk(key, k, dim=1, largest=False).indices
    return indices


def search_top_k(query_vectors: np.ndarray, corpus_vectors: Iterable[np.ndarray], corpus_ids: Sequence[str],
                 k: int, *, query_chunk_size: int = 1024) -> list[list[tuple[str, float]]]:
    """Exact top-k by inner product over a corpus given in chunks of vectors (in ``corpus_ids`` order).

    Memory is bounded by one corpus chunk times ``query_chunk_size`` scores plus k results per query. Ties are
    broken by ascending document id. Returns, per query, [(document id, score)] best first.
    """
    n_corpus = len(corpus_ids)
    order = sorted(range(n_corpus), key=corpus_ids.__getitem__)
    id_ranks = np.empty(n_corpus, dtype=np.int64)
    id_ranks[np.asarray(order, dtype=np.int64)] = np.arange(n_corpus)
    queries = torch.from_numpy(np.ascontiguousarray(query_vectors, dtype=np.float32))
    best_values = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_indices = np.full((len(queries), k), -1, dtype=np.int64)
    start = 0
    for chunk in corpus_vectors:
        chunk = torch.from_numpy(np.ascontiguousarray(chunk, dtype=np.float32))
        stop = start + len(chunk)
        if stop > n_corpus:
            raise InputError(f"the corpus vectors outnumber the {n_corpus} corpus ids")
        take = min(k, len(chunk))
        chunk_ranks = torch.from_numpy(id_ranks[start:stop])
        for row in range(0, len(queries), query_chunk_size):
            scores = queries[row:row + query_chunk_size] @ chunk.T
            local = _chunk_top(scores, chunk_ranks, take, n_corpus)
            values = scores.gather(1, local).numpy()
            merged = _merge_top(np.concatenate([best_values[row:row + query_chunk_size], values], axis=1),
                                np.concatenate([best_indices[row:row + query_chunk_size], local.numpy() + start],
                                               axis=1), id_ranks, k)
            best_values[row:row + query_chunk_size], best_indices[row:row + query_chunk_size] = merged
        start = stop
    if start != n_corpus:
        raise InputError(f"{start} corpus vectors for {n_corpus} corpus ids")
    return [[(corpus_ids[i], float(v)) for v, i in zip(values, indices) if i >= 0]
            for values, indices in zip(best_values, best_indices)]


def evaluate_retrieval(embedder, queries: Mapping[str, str], corpus: Mapping[str, str],
                       qrels: Mapping[str, Mapping[str, float] | Iterable[str]], *,
                       ks: Mapping[str, Iterable[int]] | None = None, batch_size: int = MAX_BATCH_SIZE,
                       corpus_chunk_size: int = 16384, reranker=None, rerank_top: int = 20,
                       query_prompt: str | None = None, query_prompt_name: str | None = None,
                       document_prompt: str | None = None, document_prompt_name: str | None = None
                       ) -> dict[str, float]:
    """Embed queries and corpus (normalised: cosine similarity), search exactly, and score with
    ``retrieval_metrics``. The corpus is embedded and searched ``corpus_chunk_size`` documents at a time.

    With a ``reranker`` (``encoderkit.tasks.rerank.Reranker``), each query's top ``rerank_top`` documents are
    re-ordered by the cross-encoder's scores (retrieve, then rerank); the documents below them keep the
    bi-encoder's order.

    Only queries with a relevant document in ``qrels`` are embedded and evaluated (as sentence-transformers does).
    ``query_prompt`` / ``query_prompt_name`` and ``document_prompt`` / ``document_prompt_name``: each side's prompt,
    as the text or the model's name for it (``Embedder.prompt_of``; neither: the embedder's own), as
    sentence-transformers' InformationRetrievalEvaluator takes query and corpus prompts.
    """
    from ..tasks.embed import prompt_options

    ks = _normalise_ks(ks)
    _check_ids(queries, corpus, qrels)
    if corpus_chunk_size <= 0:
        raise InputError(f"corpus_chunk_size must be positive, found {corpus_chunk_size}")
    query_ids = [qid for qid in queries
                 if qid in qrels and any(grade > 0 for grade in _grades(qrels[qid], qid).values())]
    if not query_ids:
        raise DataError("no query has a relevant document in the qrels; nothing to evaluate")
    corpus_ids = list(corpus)
    max_k = max(k for values in ks.values() for k in values)
    query_vectors = embedder.encode([queries[qid] for qid in query_ids], batch_size=batch_size, normalize=True,
                                    **prompt_options(query_prompt, query_prompt_name))

    def corpus_chunks() -> Iterable[np.ndarray]:
        for start in range(0, len(corpus_ids), corpus_chunk_size):
            texts = [corpus[doc] for doc in corpus_ids[start:start + corpus_chunk_size]]
            yield embedder.encode(texts, batch_size=batch_size, normalize=True,
                                  **prompt_options(document_prompt, document_prompt_name))

    hits = search_top_k(query_vectors, corpus_chunks(), corpus_ids, max(max_k, rerank_top if reranker else 0))
    rankings = {qid: [doc for doc, _ in found] for qid, found in zip(query_ids, hits)}
    if reranker is not None:
        rankings = rerank_rankings(reranker, queries, corpus, rankings, rerank_top)
    return retrieval_metrics(rankings, {qid: qrels[qid] for qid in query_ids}, ks)


def rerank_rankings(reranker, queries: Mapping[str, str], corpus: Mapping[str, str],
                    rankings: Mapping[str, Sequence[str]], top: int) -> dict[str, list[str]]:
    """Each query's first ``top`` documents re-ordered by the cross-encoder's logits (ties keep the retrieval
    order); the rest keep their places. All (query, document) pairs go through the engine in one call."""
    if top < 1:
        raise InputError(f"the number of candidates to rerank must be at least 1, found {top}")
    pairs = [(qid, doc) for qid, ranking in rankings.items() for doc in ranking[:top]]
    if not pairs:
        return {qid: list(ranking) for qid, ranking in rankings.items()}
    logits = reranker.logits([queries[qid] for qid, _ in pairs], [corpus[doc] for _, doc in pairs])[:, 0]
    reranked: dict[str, list[str]] = {}
    position = 0
    for qid, ranking in rankings.items():
        head = list(ranking[:top])
        values = logits[position:position + len(head)]
        position += len(head)
        order = np.argsort(-values, kind="stable")
        reranked[qid] = [head[i] for i in order] + list(ranking[top:])
    return reranked


# ---------------------------------------------------------------------------------------------------- STS, triplets

def _cosine_rows(embedder, first: Sequence[str], second: Sequence[str], batch_size: int) -> np.ndarray:
    a = embedder.encode(list(first), batch_size=batch_size, normalize=True).astype(np.float64)
    b = embedder.encode(list(second), batch_size=batch_size, normalize=True).astype(np.float64)
    return (a * b).sum(axis=1)


def sts_spearman(embedder, pairs: Sequence, *, batch_size: int = MAX_BATCH_SIZE) -> float:
    """Spearman correlation of the cosine similarity of each pair with its gold score.

    ``pairs``: (sentence1, sentence2, score) tuples, or objects with those attributes (``STSPair``)."""
    from ..tasks.sts import spearman

    rows = [(p.sentence1, p.sentence2, p.score) if hasattr(p, "sentence1") else tuple(p) for p in pairs]
    if len(rows) < 2:
        raise DataError(f"STS evaluation needs at least 2 pairs, found {len(rows)}")
    for index, row in enumerate(rows):
        if len(row) != 3:
            raise InputError(f"pairs[{index}] must be (sentence1, sentence2, score), found {len(row)} items")
    cosine = _cosine_rows(embedder, [r[0] for r in rows], [r[1] for r in rows], batch_size)
    return spearman(np.array([float(r[2]) for r in rows]), cosine)


def triplet_accuracy(embedder, anchors: Sequence[str], positives: Sequence[str], negatives: Sequence[str], *,
                     batch_size: int = MAX_BATCH_SIZE) -> float:
    """The fraction of triplets with cos(anchor, positive) > cos(anchor, negative)."""
    if not (len(anchors) == len(positives) == len(negatives)):
        raise InputError(f"anchors, positives and negatives differ in length: "
                         f"{len(anchors)}, {len(positives)}, {len(negatives)}")
    if not anchors:
        raise DataError("triplet evaluation needs at least one triplet")
    a = embedder.encode(list(anchors), batch_size=batch_size, normalize=True).astype(np.float64)
    p = embedder.encode(list(positives), batch_size=batch_size, normalize=True).astype(np.float64)
    n = embedder.encode(list(negatives), batch_size=batch_size, normalize=True).astype(np.float64)
    return float(np.mean((a * p).sum(axis=1) > (a * n).sum(axis=1)))


# ---------------------------------------------------------------------------------------------------- files

def _is_header(fields: list[str], later: Sequence[frozenset]) -> bool:
    names = [field.strip().lower() for field in fields]
    return len(names) >= 2 and names[0] in _ID_NAMES and all(
        name in later[min(i, len(later) - 1)] for i, name in enumerate(names[1:]))


def read_texts_tsv(path: str | Path, what: str = "texts") -> dict[str, str]:
    """``id<TAB>text`` lines (the text is everything after the first tab) -> {id: text}, in file order.
    A first line such as ``id<TAB>text`` or ``_id<TAB>title<TAB>text`` is taken as a header; blank lines are
    skipped. Raises DataError (file:line) on a missing column, an empty id or text, a duplicate id, no records."""
    path = Path(path)
    texts: dict[str, str] = {}
    seen: dict[str, int] = {}
    first = True
    for number, line in _lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if first:
            first = False
            if _is_header(fields, [_TEXT_NAMES]):
                continue
        if len(fields) < 2:
            raise DataError(f"{path}:{number}: expected id<TAB>text ({what}), found one column")
        key, text = fields[0].strip(), line.split("\t", 1)[1]
        if not key:
            raise DataError(f"{path}:{number}: empty id")
        if not text.strip():
            raise DataError(f"{path}:{number}: empty text for id {key!r}")
        if key in seen:
            raise DataError(f"{path}:{number}: duplicate id {key!r} (first on line {seen[key]})")
        seen[key] = number
        texts[key] = text
    if not texts:
        raise DataError(f"{path} holds no {what} (expected id<TAB>text lines)")
    return texts


def read_qrels(path: str | Path, *, queries: Mapping[str, str] | None = None,
               corpus: Mapping[str, str] | None = None) -> dict[str, dict[str, float]]:
    """``query_id<TAB>doc_id[<TAB>grade]`` lines -> {query id: {doc id: grade}} (grade 1 when absent).
    A header line (e.g. ``query_id<TAB>doc_id<TAB>score``) is accepted. Given ``queries``/``corpus``, every id
    must be among them. Raises DataError (file:line) on malformed lines, duplicate pairs or unknown ids, and when
    no pair has a grade above 0 (nothing to evaluate)."""
    path = Path(path)
    qrels: dict[str, dict[str, float]] = {}
    seen: dict[tuple[str, str], int] = {}
    first = True
    hint = " (a header line must name its columns, e.g. query_id<TAB>doc_id<TAB>grade)"
    for number, line in _lines(path):
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split("\t")]
        if first:
            first = False
            if _is_header(fields, [_ID_NAMES, _GRADE_NAMES]) and len(fields) <= 3:
                continue
        extra = hint if number == 1 else ""
        if len(fields) not in (2, 3):
            raise DataError(f"{path}:{number}: expected query_id<TAB>doc_id[<TAB>grade], found {len(fields)} "
                            f"column(s)")
        qid, doc = fields[0], fields[1]
        if not qid or not doc:
            raise DataError(f"{path}:{number}: empty {'query' if not qid else 'document'} id")
        grade = 1.0
        if len(fields) == 3:
            try:
                grade = float(fields[2])
            except ValueError:
                grade = math.nan
            if not math.isfinite(grade):
                raise DataError(f"{path}:{number}: the grade must be a finite number, found {fields[2]!r}{extra}")
        if (qid, doc) in seen:
            raise DataError(f"{path}:{number}: duplicate pair {qid!r} {doc!r} (first on line {seen[qid, doc]})")
        if queries is not None and qid not in queries:
            raise DataError(f"{path}:{number}: query id {qid!r} is not in the queries file{extra}")
        if corpus is not None and doc not in corpus:
            raise DataError(f"{path}:{number}: document id {doc!r} is not in the corpus file{extra}")
        seen[qid, doc] = number
        qrels.setdefault(qid, {})[doc] = grade
    if not qrels:
        raise DataError(f"{path} holds no qrels (expected query_id<TAB>doc_id[<TAB>grade] lines)")
    if not any(grade > 0 for relevant in qrels.values() for grade in relevant.values()):
        raise DataError(f"{path}: every grade is 0 or less, so no query has a relevant document; nothing to evaluate")
    return qrels

