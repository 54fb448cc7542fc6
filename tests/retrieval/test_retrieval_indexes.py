"""BM25, sparse inverted, multi-vector (MaxSim) and hybrid indexes: results against brute force by hand, save and
load, and the refusals (another kind's queries, another model's, an empty corpus)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from encoderkit.embeddings.sparse_vectors import SparseVectors
from encoderkit.errors import DataError, InputError
from encoderkit.retrieval import (BM25Index, HybridIndex, MultiVectorIndex, SparseIndex, build_multi_vector_index,
                                  build_sparse_index, load_index)
from encoderkit.tasks.search import build_index

pytest.importorskip("bm25s")
pytest.importorskip("faiss")


def random_sparse(rng: np.random.Generator, rows: int, dimension: int, active: tuple[int, int]) -> SparseVectors:
    parts = []
    for _ in range(rows):
        size = int(rng.integers(*active))
        terms = rng.choice(dimension, size=size, replace=False, p=zipf(dimension))
        parts.append((terms, rng.uniform(0.1, 2.0, size)))
    return SparseVectors.from_rows(parts, dimension)


def zipf(dimension: int) -> np.ndarray:
    p = 1.0 / (np.arange(dimension) + 5.0)
    return p / p.sum()


def brute_force(scores: np.ndarray, mask: np.ndarray, k: int) -> list[list[int]]:
    """Per row, the k best columns among ``mask`` by descending score, ties by ascending column."""
    out = []
    for row, keep in zip(scores, mask):
        columns = np.flatnonzero(keep)
        order = np.lexsort((columns, -row[columns]))[:k]
        out.append(columns[order].tolist())
    return out


# ----- sparse ---------------------------------------------------------------------------------------------------
def test_sparse_index_equals_brute_force_across_runs_and_ranges(tmp_path) -> None:
    rng = np.random.default_rng(0)
    docs = random_sparse(rng, 400, 300, (5, 40))
    queries = random_sparse(rng, 12, 300, (1, 15))
    ids = [f"d{i}" for i in range(len(docs))]
    # small buffers: several runs, several merge ranges, one term larger than a range
    index = build_sparse_index((docs[i:i + 37] for i in range(0, len(docs), 37)), tmp_path / "sp", ids=ids,
                               info={"model": "splade-test"}, run_postings=900, merge_postings=500)
    one_run = build_sparse_index(docs, tmp_path / "one", ids=ids)
    dense_scores = queries.to_dense() @ docs.to_dense().T
    touched = (queries.to_dense() != 0).astype(float) @ (docs.to_dense() != 0).T.astype(float) > 0
    found = index.search(queries, k=10)
    assert found.indices.tolist() == [row + [-1] * (10 - len(row)) for row in brute_force(dense_scores, touched, 10)]
    valid = found.indices >= 0
    assert np.allclose(found.scores[valid], np.take_along_axis(dense_scores, np.maximum(found.indices, 0), 1)[valid],
                       rtol=1e-5)
    assert found.ids[0][0] == ids[found.indices[0, 0]]
    assert np.array_equal(one_run.search(queries, 10).indices, found.indices)
    assert list(np.load(tmp_path / "sp" / "docs.npy")) == list(np.load(tmp_path / "one" / "docs.npy"))
    assert not list((tmp_path / "sp").glob("run-*")) and not (tmp_path / "sp" / "ids.ends.tmp").exists()
    copy = load_index(index.save(tmp_path / "copy"))
    assert isinstance(copy, SparseIndex) and list(copy.ids) == ids and copy.info["model"] == "splade-test"
    again = copy.search(queries, 10)
    assert np.array_equal(again.indices, found.indices) and np.array_equal(again.scores, found.scores)


def test_sparse_index_refusals(tmp_path) -> None:
    rng = np.random.default_rng(1)
    docs = random_sparse(rng, 20, 50, (2, 6))
    index = build_sparse_index(docs, tmp_path / "sp", info={"model": "splade-a"})
    with pytest.raises(InputError, match="sparse index: it takes SparseVectors"):
        index.search(np.ones((1, 50), np.float32))
    with pytest.raises(InputError, match="built with the model splade-a, but the queries come from splade-b"):
        index.search(docs[:1], model="splade-b")
    with pytest.raises(InputError, match="40 dimensions but the index's vocabulary has 50"):
        index.search(random_sparse(rng, 1, 40, (2, 4)))
    with pytest.raises(InputError, match="corpus is empty"):
        build_sparse_index([], tmp_path / "empty")
    with pytest.raises(InputError, match="corpus is empty"):
        build_sparse_index(SparseVectors.from_rows([], 50), tmp_path / "empty")
    with pytest.raises(InputError, match="not a bm25 one"):
        BM25Index.load(tmp_path / "sp")
    assert index.search(docs[:1], model="splade-a").indices[0, 0] >= 0


# ----- BM25 -----------------------------------------------------------------------------------------------------
CORPUS = ["The cat sat on the mat.", "A dog chased the cat around the garden.", "Stock markets fell sharply today.",
          "The garden is full of flowers and a cat.", "Dogs and cats are common pets."]


def lucene_bm25(corpus_terms: list[list[str]], query_terms: list[str], k1: float = 1.5, b: float = 0.75):
    n, average = len(corpus_terms), sum(map(len, corpus_terms)) / len(corpus_terms)
    scores = []
    for terms in corpus_terms:
        score = 0.0
        for term in set(query_terms):
            df = sum(term in d for d in corpus_terms)
            tf = terms.count(term)
            if df and tf:
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                score += idf * tf / (tf + k1 * (1 - b + b * len(terms) / average))  # Lucene 8+: no (k1 + 1)
        scores.append(score)
    return np.array(scores)


def test_bm25_scores_by_hand_save_and_load(tmp_path) -> None:
    index = BM25Index.build(CORPUS, ids=[f"doc{i}" for i in range(5)])
    terms = index.tokenize(CORPUS)
    assert terms[0] == ["cat", "sat", "mat"]  # lowercased, stopwords ("the", "on") and 1-letter words gone
    found = index.search(["cat in the garden", "bonds rallied"], k=3)
    expected = lucene_bm25(terms, ["cat", "garden"])
    order = np.lexsort((np.arange(5), -expected))[:3]
    assert found.indices[0].tolist() == order.tolist()
    assert np.allclose(found.scores[0], expected[order], rtol=1e-5)
    assert found.indices[1].tolist() == [-1, -1, -1] and found.ids[1] == []  # no shared term: no hit
    index.save(tmp_path / "bm")
    loaded = load_index(tmp_path / "bm")
    assert isinstance(loaded, BM25Index) and loaded.settings == index.settings
    assert loaded.settings["stopwords"] == "en" and loaded.settings["stemmer"] is None
    again = loaded.search(["cat in the garden", "bonds rallied"], k=3)
    assert np.array_equal(again.indices, found.indices) and np.allclose(again.scores, found.scores)
    assert again.ids[0] == [f"doc{i}" for i in order]


def test_bm25_settings_and_refusals() -> None:
    kept = BM25Index.build(CORPUS, stopwords=None, k1=0.9, b=0.4)
    assert kept.tokenize(["The cat"]) == [["the", "cat"]]
    assert kept.settings["k1"] == 0.9 and kept.settings["b"] == 0.4
    with pytest.raises(InputError, match="corpus is empty"):
        BM25Index.build([])
    with pytest.raises(InputError, match="unknown BM25 method"):
        BM25Index.build(CORPUS, method="okapi-ish")
    with pytest.raises(InputError, match="unknown stopword list"):
        BM25Index.build(CORPUS, stopwords="klingon")
    with pytest.raises(InputError, match="bm25 index: it takes query texts"):
        kept.search(np.ones((1, 4)))
    with pytest.raises(InputError, match="no model"):
        kept.search(["cat"], model="some-model")


# ----- multi-vector ---------------------------------------------------------------------------------------------
def token_corpus(rng: np.random.Generator, docs: int, dim: int = 16) -> list[np.ndarray]:
    centres = rng.standard_normal((40, dim)).astype(np.float32)
    out = []
    for _ in range(docs):
        picked = centres[rng.integers(0, 40, int(rng.integers(3, 12)))]
        vectors = picked + 0.3 * rng.standard_normal(picked.shape).astype(np.float32)
        out.append(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    return out


def maxsim_by_hand(query: np.ndarray, docs: list[np.ndarray]) -> np.ndarray:
    return np.array([sum(max(float(q @ t) for t in doc) for q in query) for doc in docs])


def test_multi_vector_ivf_with_enough_probes_equals_brute_force_maxsim(tmp_path) -> None:
    rng = np.random.default_rng(2)
    docs = token_corpus(rng, 300)
    queries = token_corpus(rng, 6)
    ivf = build_multi_vector_index([docs[:100], docs[100:]], tmp_path / "mv", ids=[f"p{i}" for i in range(300)],
                                   info={"model": "colbert-test"}, ivf_min_tokens=0, nlist=8, codec="flat",
                                   train_sample=5000, token_candidates=64, rerank_depth=1000)
    assert ivf.has_ivf
    ivf.settings.nprobe = 8  # every list
    found = ivf.search(queries, k=5)
    for q, query in enumerate(queries):
        expected = maxsim_by_hand(query, docs)
        order = np.lexsort((np.arange(len(docs)), -expected))[:5]
        assert found.indices[q].tolist() == order.tolist()
        assert np.allclose(found.scores[q], expected[order], rtol=1e-4)
        assert len(ivf.candidates(query)) < len(docs)  # the IVF narrowed the candidates
    small = build_multi_vector_index(docs, tmp_path / "small")  # few tokens: no IVF, exact MaxSim
    assert not small.has_ivf
    assert np.array_equal(small.search(queries, 5).indices, found.indices)
    half = build_multi_vector_index(docs, tmp_path / "half", dtype="float16")
    assert (tmp_path / "half" / "tokens.bin").stat().st_size * 2 == (tmp_path / "small" / "tokens.bin").stat().st_size
    loaded = load_index(ivf.save(tmp_path / "copy"))
    assert isinstance(loaded, MultiVectorIndex) and loaded.has_ivf and loaded.settings.codec == "flat"
    loaded.settings.nprobe = 8
    assert loaded.search(queries, 5).ids == found.ids
    assert half.search(queries, 5).indices[:, 0].tolist() == found.indices[:, 0].tolist()


def test_multi_vector_refusals(tmp_path) -> None:
    rng = np.random.default_rng(3)
    docs = token_corpus(rng, 10)
    index = build_multi_vector_index(docs, tmp_path / "mv", info={"model": "colbert-a"})
    with pytest.raises(InputError, match="multi-vector index: it takes a list of"):
        index.search(np.ones((2, 16), np.float32))
    with pytest.raises(InputError, match="8-dim token vectors, the index's are 16-dim"):
        index.search([np.ones((2, 8), np.float32)])
    with pytest.raises(InputError, match="colbert-a"):
        index.search(docs[:1], model="colbert-b")
    with pytest.raises(InputError, match="corpus is empty"):
        build_multi_vector_index([], tmp_path / "empty")
    with pytest.raises(InputError, match="document 1 has no token vectors"):
        build_multi_vector_index([docs[0], np.zeros((0, 16), np.float32)], tmp_path / "bad")


# ----- hybrid ---------------------------------------------------------------------------------------------------
def test_hybrid_rrf_and_weighted_by_hand(tmp_path) -> None:
    rng = np.random.default_rng(4)
    vectors = rng.standard_normal((5, 8)).astype(np.float32)
    ids = [f"doc{i}" for i in range(5)]
    dense = build_index(vectors, ids, metric="ip")
    dense.info = {"model": "dense-model"}
    bm25 = BM25Index.build(CORPUS, ids=ids)
    query_vector, query_text = rng.standard_normal((1, 8)).astype(np.float32), ["cat garden"]
    hybrid = HybridIndex({"dense": dense, "bm25": bm25})
    found = hybrid.search({"dense": query_vector, "bm25": query_text}, k=5)
    d, s = dense.search(query_vector, 5), bm25.search(query_text, 5)
    expected = np.zeros(5)
    for result in (d, s):
        for rank, row in enumerate(result.indices[0], start=1):
            if row >= 0:
                expected[row] += 1 / (60 + rank)
    order = np.lexsort((np.arange(5), -expected))
    order = order[expected[order] > 0]
    assert found.indices[0][:len(order)].tolist() == order.tolist()
    assert np.allclose(found.scores[0][:len(order)], expected[order])

    weighted = HybridIndex({"dense": dense, "bm25": bm25}, fusion="weighted", weights={"dense": 0.3, "bm25": 0.7})
    expected = np.zeros(5)
    for weight, result in ((0.3, d), (0.7, s)):
        valid = result.indices[0] >= 0
        scores = result.scores[0][valid].astype(np.float64)
        expected[result.indices[0][valid]] += weight * (scores - scores.min()) / (scores.max() - scores.min())
    got = weighted.search({"dense": query_vector, "bm25": query_text}, k=5)
    assert np.allclose(got.scores[0], np.sort(expected)[::-1], atol=1e-6)

    weighted.save(tmp_path / "hy")
    loaded = load_index(tmp_path / "hy")
    assert isinstance(loaded, HybridIndex) and loaded.fusion == "weighted" and loaded.weights["bm25"] == 0.7
    assert loaded.settings["parts"]["dense"] == {"kind": "exact", "model": "dense-model"}
    assert (tmp_path / "hy" / "parts" / "bm25" / "index.json").is_file()
    again = loaded.search({"dense": query_vector, "bm25": query_text}, k=5)
    assert np.array_equal(again.indices, got.indices) and np.allclose(again.scores, got.scores)


def test_hybrid_refusals(tmp_path) -> None:
    rng = np.random.default_rng(5)
    ids = [f"doc{i}" for i in range(5)]
    dense = build_index(rng.standard_normal((5, 8)), ids)
    dense.info = {"model": "dense-model"}
    bm25 = BM25Index.build(CORPUS, ids=ids)
    hybrid = HybridIndex({"dense": dense, "bm25": bm25})
    with pytest.raises(InputError, match="missing: bm25"):
        hybrid.search({"dense": np.ones((1, 8))})
    with pytest.raises(InputError, match="part 'dense' is a exact index: it takes a"):
        hybrid.search({"dense": ["cat"], "bm25": ["cat"]})
    with pytest.raises(InputError, match="built with the model dense-model"):
        hybrid.search({"dense": np.ones((1, 8)), "bm25": ["cat"]}, models={"dense": "other"})
    with pytest.raises(InputError, match="takes a dict"):
        hybrid.search(np.ones((1, 8)))
    with pytest.raises(InputError, match="different corpora"):
        HybridIndex({"dense": dense, "bm25": BM25Index.build(CORPUS[:4])})
    with pytest.raises(InputError, match="row 0 is 'doc0'"):
        HybridIndex({"dense": dense, "bm25": BM25Index.build(CORPUS)})
    with pytest.raises(InputError, match="at least two parts"):
        HybridIndex({"dense": dense})
    with pytest.raises(InputError, match="unknown fusion"):
        HybridIndex({"dense": dense, "bm25": bm25}, fusion="max")


def test_load_index_errors(tmp_path) -> None:
    with pytest.raises(DataError, match="not a saved index"):
        load_index(tmp_path)
    (tmp_path / "index.json").write_text('{"kind": "nope"}')
    with pytest.raises(DataError, match="unknown index kind 'nope'"):
        load_index(tmp_path)
