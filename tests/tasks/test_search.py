from __future__ import annotations

import numpy as np
import pytest

from encoderkit import InputError
from encoderkit.tasks.search import ApproximateIndex, ExactIndex, VectorIndex, build_index

pytest.importorskip("faiss")


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def recall_at(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / exact.shape[1] for a, b in zip(found, exact)]))


def test_exact_index_equals_brute_force_across_chunks() -> None:
    rng = np.random.default_rng(0)
    vectors, queries = rng.standard_normal((5000, 32)), rng.standard_normal((20, 32))
    index = ExactIndex(32, "ip", chunk_rows=700)  # several chunks, the last one partial
    index.add(vectors[:3000])
    index.add(vectors[3000:], ids=[f"doc{i}" for i in range(3000, 5000)])
    result = index.search(queries, k=7)
    scores = queries @ vectors.T
    expected = np.argsort(-scores, axis=1)[:, :7]
    assert np.array_equal(result.indices, expected)
    assert np.allclose(result.scores, np.take_along_axis(scores, expected, 1), atol=1e-4)
    assert result.ids[0][0] == (f"doc{expected[0, 0]}" if expected[0, 0] >= 3000 else str(expected[0, 0]))


def test_sq8_recall_on_100k_random_unit_vectors(tmp_path) -> None:
    """The acceptance case: 100k random 384-dim unit vectors, recall@10 against exact search."""
    rng = np.random.default_rng(1)
    vectors, queries = unit(rng, 100_000, 384), unit(rng, 200, 384)
    exact = build_index(vectors).search(queries, 10).indices
    approximate = build_index(vectors, kind="sq8")
    found = approximate.search(queries, 10)
    assert recall_at(found.indices, exact) >= 0.95
    approximate.save(tmp_path / "idx")
    again = VectorIndex.load(tmp_path / "idx").search(queries, 10)
    assert np.array_equal(again.indices, found.indices) and np.array_equal(again.scores, found.scores)


def test_hnsw_recall_on_clustered_vectors(tmp_path) -> None:
    """Real embeddings have neighbourhood structure; HNSW finds it (random vectors have none: see BENCHMARKS.md)."""
    rng = np.random.default_rng(2)
    centres = unit(rng, 200, 64)
    vectors = centres[rng.integers(0, 200, 20_000)] + 0.15 * rng.standard_normal((20_000, 64)).astype(np.float32)
    queries = centres[rng.integers(0, 200, 200)] + 0.15 * rng.standard_normal((200, 64)).astype(np.float32)
    exact = build_index(vectors).search(queries, 10).indices
    hnsw = build_index(vectors, kind="hnsw")
    found = hnsw.search(queries, 10)
    assert recall_at(found.indices, exact) >= 0.95
    hnsw.save(tmp_path / "h")
    loaded = VectorIndex.load(tmp_path / "h")
    assert isinstance(loaded, ApproximateIndex) and loaded.kind == "hnsw"
    assert np.array_equal(loaded.search(queries, 10).indices, found.indices)


def test_exact_save_load_is_identical(tmp_path) -> None:
    rng = np.random.default_rng(3)
    index = build_index(rng.standard_normal((1000, 16)), [f"id-{i}" for i in range(1000)])
    queries = rng.standard_normal((5, 16))
    index.save(tmp_path)
    loaded = VectorIndex.load(tmp_path)
    a, b = index.search(queries, 5), loaded.search(queries, 5)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.scores, b.scores) and a.ids == b.ids


def test_bad_index_input() -> None:
    index = ExactIndex(8)
    with pytest.raises(InputError, match="empty"):
        index.search(np.ones(8), 3)
    with pytest.raises(InputError, match=r"shape \(n, 8\)"):
        index.add(np.ones((2, 9)))
    with pytest.raises(InputError, match="NaN"):
        index.add(np.full((1, 8), np.nan))
    with pytest.raises(InputError, match="unknown metric"):
        ExactIndex(8, "l3")
    index.add(np.eye(8)[:3])
    assert index.search(np.eye(8)[0], 10).indices.shape == (1, 3)  # k larger than the index
