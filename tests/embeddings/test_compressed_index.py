"""Compressed indexes (IVF-PQ, int8, binary) built streaming from Parquet shards, searched memory-mapped.

References: sentence-transformers' ``quantize_embeddings`` for the codes, exact search for the results."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from encoderkit import DataError, InputError
from encoderkit.cli import main
from encoderkit.tasks.search import VectorIndex, build_index

faiss = pytest.importorskip("faiss")
pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from encoderkit.embeddings.compressed import CompressedIndex, IdColumn, build_streaming  # noqa: E402
from encoderkit.embeddings.quantization import quantize_embeddings  # noqa: E402
from encoderkit.embeddings.shards import EmbeddingShards, write_shards  # noqa: E402


def clustered(rng: np.random.Generator, n: int, dim: int, centres: np.ndarray, noise: float = 1.0) -> np.ndarray:
    """A Gaussian mixture around unit centres, normalized: neighbourhoods with structure, as real embeddings
    have (noise 1: the noise vector is as long as the centre)."""
    centres = centres / np.linalg.norm(centres, axis=1, keepdims=True)
    x = centres[rng.integers(0, len(centres), n)] + noise * rng.standard_normal((n, dim)) / np.sqrt(dim)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def recall_at(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / exact.shape[1] for a, b in zip(found, exact)]))


@pytest.fixture(scope="module")
def corpus() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """20k 64-dim vectors around 100 centres, 100 queries, and their exact top 10."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((100, 64))
    vectors, queries = clustered(rng, 20_000, 64, centres), clustered(rng, 100, 64, centres)
    return vectors, queries, build_index(vectors).search(queries, 10).indices


@pytest.fixture(scope="module")
def shards(tmp_path_factory, corpus) -> Path:
    vectors = corpus[0]
    return write_shards(tmp_path_factory.mktemp("shards"), vectors, [f"doc-{i}" for i in range(len(vectors))],
                        rows_per_shard=6000)  # 4 shards, the last one partial


# ----- the codes, against sentence-transformers ----------------------------------------------------
def test_quantization_equals_sentence_transformers(corpus) -> None:
    from sentence_transformers.quantization import quantize_embeddings as st_quantize

    vectors = corpus[0][:3000]
    calibration = corpus[0][10_000:12_000]
    for precision in ("int8", "uint8"):
        mine = quantize_embeddings(vectors, precision, calibration=calibration)
        reference = st_quantize(vectors, precision, calibration_embeddings=calibration)
        assert mine.dtype == reference.dtype and np.array_equal(mine, reference)
    for precision in ("binary", "ubinary"):
        mine = quantize_embeddings(vectors, precision)
        reference = st_quantize(vectors, precision)
        assert mine.dtype == reference.dtype and np.array_equal(mine, reference)
    with pytest.raises(InputError, match="ranges= or calibration="):
        quantize_embeddings(vectors, "int8")


def test_index_codes_are_the_sentence_transformers_codes(corpus) -> None:
    """The int8 index calibrates on its training sample (here all vectors) and stores exactly ST's codes;
    the binary index stores ST's ubinary bytes."""
    from sentence_transformers.quantization import quantize_embeddings as st_quantize

    vectors = corpus[0][:5000]
    int8 = build_index(vectors, kind="int8", metric="ip", train_sample=10_000)  # ip: the vectors as given
    codes = faiss.vector_to_array(int8._index.codes).reshape(len(vectors), -1).astype(np.int16) - 128
    reference = st_quantize(vectors, "int8", calibration_embeddings=vectors)
    assert np.array_equal(codes, reference)
    assert np.array_equal(int8.ranges, np.vstack([vectors.min(0), vectors.max(0)]))
    binary = build_index(vectors, kind="binary")
    bits = faiss.vector_to_array(binary._index.xb).reshape(len(vectors), -1)
    assert np.array_equal(bits, st_quantize(vectors, "ubinary"))


# ----- search: rescoring against exact -------------------------------------------------------------
@pytest.mark.parametrize("kind", ["int8", "binary"])
def test_rescoring_everything_is_exact_search(corpus, kind) -> None:
    """With k x multiplier >= n every vector is a candidate: the float rescoring must then be exact search."""
    vectors, queries, exact = corpus
    small = vectors[:2000]
    want = build_index(small).search(queries, 10)
    got = build_index(small, kind=kind, rescore_multiplier=200).search(queries, 10)
    assert np.allclose(got.scores, want.scores, atol=1e-5)  # the same top 10 scores (ties may swap rows)
    assert recall_at(got.indices, want.indices) >= 0.99
    assert np.allclose(got.scores, np.einsum("qd,qkd->qk", queries, small[got.indices]), atol=1e-5)


def test_default_rescoring_recall(corpus) -> None:
    vectors, queries, exact = corpus
    assert recall_at(build_index(vectors, kind="int8").search(queries, 10).indices, exact) >= 0.98
    # binary codes need many dimensions: 384 bits here
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((50, 384))
    vectors, queries = clustered(rng, 5000, 384, centres), clustered(rng, 100, 384, centres)
    exact = build_index(vectors).search(queries, 10).indices
    recalls = {m: recall_at(build_index(vectors, kind="binary", rescore_multiplier=m).search(queries, 10).indices,
                            exact) for m in (1, 4, 10)}
    assert recalls[1] < recalls[4] < recalls[10] and recalls[4] >= 0.7


# ----- IVF-PQ built streaming from shards ----------------------------------------------------------
def test_ivfpq_from_shards(tmp_path, shards, corpus) -> None:
    vectors, queries, exact = corpus
    source = EmbeddingShards.open(shards)
    assert (source.count, source.dimension, source.id_kind, len(source.shards)) == (20_000, 64, "string", 4)
    index = build_streaming(source, tmp_path / "ivf", kind="ivfpq", rescore_multiplier=10, show_progress=False)
    assert isinstance(index.ids, IdColumn) and index.nlist == 512 and index.pq_m == 8
    assert index.ids[123] == "doc-123" and index.ids[-1] == "doc-19999"
    index.nprobe, index.rescore_multiplier = 32, 0
    plain = index.search(queries, 10)
    index.rescore_multiplier = 10
    rescored = index.search(queries, 10)
    assert recall_at(plain.indices, exact) >= 0.35
    assert recall_at(rescored.indices, exact) >= 0.95 > recall_at(plain.indices, exact)
    assert rescored.ids[0] == [f"doc-{row}" for row in rescored.indices[0]]
    # every list scanned and every vector a candidate: exact search, through shards, PQ and the id file
    index.nprobe, index.rescore_multiplier = index.nlist, 2000
    assert np.array_equal(index.search(queries, 10).indices, exact)
    # the saved index is read memory-mapped and answers the same
    loaded = VectorIndex.load(tmp_path / "ivf")
    assert isinstance(loaded, CompressedIndex) and isinstance(loaded.vectors, np.memmap)
    loaded.nprobe = 32
    assert np.array_equal(loaded.search(queries, 10).indices, rescored.indices)
    file_bytes = (tmp_path / "ivf" / "index.faiss").stat().st_size
    assert file_bytes / 20_000 < 0.25 * 64 * 4  # PQ8 codes + ids + centroids, against 256 bytes of float32


@pytest.mark.parametrize("kind", ["int8", "binary"])
def test_streamed_codes_equal_in_memory_codes(tmp_path, shards, corpus, kind) -> None:
    """A streaming build writes the codes into one presized buffer; they must be the in-memory build's codes
    (calibrated on all 20k vectors in both), and single queries (searched on one thread) the batch's answers."""
    vectors, queries, _ = corpus
    streamed = build_streaming(EmbeddingShards.open(shards), tmp_path / kind, kind=kind, train_sample=20_000,
                               show_progress=False)
    in_memory = build_index(vectors, kind=kind, train_sample=20_000)
    field = "xb" if kind == "binary" else "codes"
    assert streamed._index.ntotal == len(vectors)
    assert np.array_equal(faiss.vector_to_array(getattr(streamed._index, field)),
                          faiss.vector_to_array(getattr(in_memory._index, field)))
    batch = streamed.search(queries, 10)
    assert np.array_equal(batch.indices, in_memory.search(queries, 10).indices)
    threads = faiss.omp_get_max_threads()
    assert np.array_equal(np.vstack([streamed.search(q, 10).indices for q in queries[:20]]), batch.indices[:20])
    assert faiss.omp_get_max_threads() == threads  # restored after the single-query searches


def test_in_memory_index_saves_compact_ids(tmp_path, corpus) -> None:
    vectors, queries, _ = corpus
    index = build_index(vectors[:3000], [f"é-{i}" for i in range(3000)], kind="int8")
    index.save(tmp_path / "i8")
    assert not (tmp_path / "i8" / "ids.txt").exists()
    loaded = VectorIndex.load(tmp_path / "i8")
    a, b = index.search(queries, 5), loaded.search(queries, 5)
    assert np.array_equal(a.indices, b.indices) and a.ids == b.ids and a.ids[0][0].startswith("é-")


def test_integer_ids_and_npy_source_through_the_cli(tmp_path) -> None:
    """`encoderkit index` on shards with integer ids; the query model (MiniLM, 384-d) fixes the width."""
    rng = np.random.default_rng(5)
    vectors = clustered(rng, 3000, 384, rng.standard_normal((30, 384)))
    write_shards(tmp_path / "s", vectors, np.arange(3000, dtype=np.int64) * 7, rows_per_shard=1000)
    assert main(["index", str(tmp_path / "s"), "--out", str(tmp_path / "idx"), "--kind", "binary",
                 "--rescore-multiplier", "300"]) == 0
    index = VectorIndex.load(tmp_path / "idx")
    assert (tmp_path / "idx" / "ids.npy").is_file() and index.ids[2] == "14"
    want = build_index(vectors).search(vectors[:5], 10)
    assert np.array_equal(index.search(vectors[:5], 10).indices, want.indices)


def test_cli_search_on_a_shard_index(tmp_path, capsys) -> None:
    from encoderkit import Embedder

    texts = ["a cat sleeps on the sofa", "the kitten naps by the window", "stock markets fell sharply",
             "shares dropped on wall street", "rain is expected tomorrow", "the forecast says showers"]
    vectors = Embedder.from_pretrained().encode(texts)
    write_shards(tmp_path / "s", vectors, [f"t{i}" for i in range(len(texts))])
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["index", str(tmp_path / "s"), "--out", str(tmp_path / "idx"), "--kind", "int8",
                 "--texts", str(tmp_path / "texts.txt")]) == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "idx"), "a sleeping cat", "-k", "2", "--json",
                 "--rescore-multiplier", "3"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert {h["id"] for h in hits} == {"t0", "t1"} and hits[0]["text"] in texts[:2]
    assert main(["search", str(tmp_path / "idx"), "cat", "--nprobe", "4"]) == 2
    assert "--nprobe applies to ivfpq" in capsys.readouterr().err


def test_a_ray_engine_manifest_names_the_query_model_and_an_unfinished_job_is_refused(tmp_path, capsys) -> None:
    """The Ray engine's manifest records the model as a record (its path among its facts) and marks a job that has
    not finished; the index reads the first and refuses the second."""
    from encoderkit import Embedder
    from encoderkit.io.hub import default_model_path

    texts = ["a cat sleeps on the sofa", "stock markets fell sharply", "rain is expected tomorrow"]
    write_shards(tmp_path / "s", Embedder.from_pretrained().encode(texts), [f"t{i}" for i in range(3)])
    manifest_path = tmp_path / "s" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["model"] = {"name": "default", "path": str(default_model_path()), "pooling": "mean"}
    manifest.update(complete=False, shard_count=2)
    manifest_path.write_text(json.dumps(manifest))
    assert main(["index", str(tmp_path / "s"), "--out", str(tmp_path / "idx"), "--kind", "int8"]) == 2
    assert "has not finished" in capsys.readouterr().err and not (tmp_path / "idx" / "index.json").exists()
    manifest["complete"] = True
    manifest_path.write_text(json.dumps(manifest))
    assert main(["index", str(tmp_path / "s"), "--out", str(tmp_path / "idx"), "--kind", "int8"]) == 0
    info = json.loads((tmp_path / "idx" / "index.json").read_text())
    assert Path(info["info"]["model"]).resolve() == Path(default_model_path()).resolve()
    capsys.readouterr()
    assert main(["search", str(tmp_path / "idx"), "a sleeping cat", "-k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["id"] == "t0"


# ----- errors -------------------------------------------------------------------------------------
def test_shard_errors(tmp_path, corpus) -> None:
    vectors = corpus[0][:300]
    write_shards(tmp_path / "ok", vectors, rows_per_shard=100)
    (tmp_path / "ok" / "part-00001.parquet").unlink()
    with pytest.raises(DataError, match="lists 1 shard.*do not exist.*part-00001"):
        EmbeddingShards.open(tmp_path / "ok")
    write_shards(tmp_path / "mixed", vectors, rows_per_shard=200)
    write_shards(tmp_path / "other", vectors[:, :32])
    (tmp_path / "other" / "part-00000.parquet").rename(tmp_path / "mixed" / "part-00009.parquet")
    (tmp_path / "mixed" / "manifest.json").unlink()
    with pytest.raises(DataError, match="mix vector dimensions 32 .*part-00009.*64"):
        EmbeddingShards.open(tmp_path / "mixed")
    for column, name in (("id", "no-id"), ("embedding", "no-embedding")):
        (tmp_path / name).mkdir()
        table = pa.table({"id": np.arange(3), "embedding": [[0.5, 1.0]] * 3})
        pq.write_table(table.drop_columns([column]), tmp_path / name / "part.parquet")
        with pytest.raises(DataError, match=f"no column '{column}'"):
            EmbeddingShards.open(tmp_path / name)
    (tmp_path / "ragged").mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "embedding": [[0.5, 1.0], [1.0]]}), tmp_path / "ragged" / "p.parquet")
    with pytest.raises(DataError, match="an embedding has 1 values where the shard's first has 2"):
        list(EmbeddingShards.open(tmp_path / "ragged").iter_batches())
    with pytest.raises(DataError, match="not a directory"):
        EmbeddingShards.open(tmp_path / "absent")


def test_too_few_vectors_and_wrong_queries(tmp_path, corpus) -> None:
    vectors, queries, _ = corpus
    with pytest.raises(InputError, match=r"1,024 IVF lists needs at least 39,936 training vectors.*20,000 "
                                         r"were available.*--nlist 512 or fewer"):
        build_index(vectors, kind="ivfpq", nlist=1024)
    with pytest.raises(InputError, match=r"needs at least 39,936.*--train-sample 39936"):
        build_index(np.concatenate([vectors, vectors]), kind="ivfpq", nlist=1024, train_sample=20_000)
    with pytest.raises(InputError, match="PQ codebooks of 256 centroids needs at least 9,984.*--kind int8"):
        build_index(vectors[:5000], kind="ivfpq", nlist=16)
    with pytest.raises(InputError, match="--pq-m 7 must divide the dimension 64"):
        build_index(vectors, kind="ivfpq", pq_m=7)
    index = build_index(vectors[:1000], kind="binary")
    with pytest.raises(InputError, match=r"queries must have shape \(n, 64\), found \(1, 32\)"):
        index.search(queries[0, :32], 10)
    write_shards(tmp_path / "s", vectors[:500])
    assert main(["index", str(tmp_path / "s"), "--out", str(tmp_path / "idx"), "--kind", "ivfpq"]) == 2
