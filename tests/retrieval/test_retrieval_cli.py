"""`encoderkit index --kind bm25|sparse|hybrid`, `search` and `eval-retrieval --kind` end to end."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from encoderkit.cli import main
from encoderkit.jobs import DEMO_SENTENCES
from encoderkit.retrieval import BM25Index, HybridIndex, SparseIndex, load_index

from helpers import tiny_bert_dir

pytest.importorskip("bm25s")


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"s{i}", "text": t}) + "\n" for i, t in enumerate(texts)),
                    encoding="utf-8")
    return path


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("encoderkit: error: ") and "Traceback" not in err[0]
    return err[0]


def test_bm25_index_and_search(tmp_path: Path, capsys) -> None:
    docs = write_jsonl(tmp_path / "docs.jsonl", DEMO_SENTENCES)
    assert main(["index", str(docs), "--kind", "bm25", "--out", str(tmp_path / "bm"), "--k1", "1.2",
                 "--stopwords", "none"]) == 0
    meta = json.loads((tmp_path / "bm" / "index.json").read_text())
    assert meta["kind"] == "bm25" and meta["params"]["k1"] == 1.2 and meta["params"]["stopwords"] is None
    capsys.readouterr()
    assert main(["search", str(tmp_path / "bm"), "the cat sleeps by the window", "-k", "2", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert {h["id"] for h in hits} == {"s4", "s5"} and hits[0]["text"] == DEMO_SENTENCES[int(hits[0]["id"][1:])]
    expected = BM25Index.load(tmp_path / "bm").search(["the cat sleeps by the window"], 2)
    assert [h["score"] for h in hits] == pytest.approx(expected.scores[0].tolist())
    assert main(["search", str(tmp_path / "bm"), "cat", "--model", "default"]) == 2
    assert "--model does not apply to a bm25 index" in error_line(capsys)
    assert main(["index", str(docs), "--kind", "bm25", "--out", str(tmp_path / "x"), "--truncate-dim", "8"]) == 2
    assert "--truncate-dim is for the dense kinds" in error_line(capsys)
    assert main(["index", str(docs), "--kind", "bm25", "--out", str(tmp_path / "x"), "--nprobe", "8"]) == 2
    assert "--nprobe applies to --kind ivfpq / multi-vector, not bm25" in error_line(capsys)
    (tmp_path / "empty.txt").write_text("")
    assert main(["index", str(tmp_path / "empty.txt"), "--kind", "bm25", "--out", str(tmp_path / "e")]) == 2
    assert "corpus is empty" in error_line(capsys)


def test_hybrid_of_dense_and_bm25(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(DEMO_SENTENCES) + "\n", encoding="utf-8")
    assert main(["embed", str(corpus), "--out", str(tmp_path / "docs.npy")]) == 0
    assert main(["index", str(tmp_path / "docs.npy"), "--out", str(tmp_path / "dense"), "--texts", str(corpus)]) == 0
    assert main(["index", str(corpus), "--kind", "bm25", "--out", str(tmp_path / "bm")]) == 0
    assert main(["index", "--kind", "hybrid", "--part", f"dense={tmp_path / 'dense'}", "--part",
                 f"bm25={tmp_path / 'bm'}", "--weight", "bm25=0.5", "--out", str(tmp_path / "hy")]) == 0
    meta = json.loads((tmp_path / "hy" / "index.json").read_text())
    assert meta["kind"] == "hybrid" and meta["params"]["fusion"] == "rrf" and meta["params"]["k_rrf"] == 60
    assert meta["params"]["parts"]["dense"]["kind"] == "exact" and meta["params"]["parts"]["bm25"]["model"] is None
    assert meta["params"]["weights"] == {"dense": 1.0, "bm25": 0.5}
    assert (tmp_path / "hy" / "parts" / "dense" / "vectors.npy").is_file()
    capsys.readouterr()
    query = "feline resting near the glass"
    assert main(["search", str(tmp_path / "hy"), query, "-k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert {h["text"] for h in hits[:2]} == {DEMO_SENTENCES[4], DEMO_SENTENCES[5]}
    hybrid = load_index(tmp_path / "hy")
    assert isinstance(hybrid, HybridIndex)
    from encoderkit import Embedder

    expected = hybrid.search({"dense": Embedder.from_pretrained().encode([query]), "bm25": [query]}, 3)
    assert [h["id"] for h in hits] == expected.ids[0]
    assert main(["search", str(tmp_path / "hy"), query, "--model", "default"]) == 2
    assert "--model does not apply to a hybrid index" in error_line(capsys)
    assert main(["index", "--kind", "hybrid", "--part", f"dense={tmp_path / 'dense'}", "--out",
                 str(tmp_path / "one")]) == 2
    assert "two or more --part" in error_line(capsys)


def write_eval_set(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "corpus.tsv").write_text("".join(f"d{i}\t{t}\n" for i, t in enumerate(DEMO_SENTENCES)))
    questions = {"q1": "a guitarist playing music", "q2": "shares dropped after the news",
                 "q3": "my cat naps in the sun", "q4": "I need to reset my password"}
    (tmp_path / "queries.tsv").write_text("".join(f"{q}\t{t}\n" for q, t in questions.items()))
    (tmp_path / "qrels.tsv").write_text("q1\td0\nq1\td1\nq2\td2\nq2\td3\nq3\td4\nq3\td5\nq4\td6\nq4\td7\n")
    return {name: str(tmp_path / f"{name}.tsv") for name in ("queries", "corpus", "qrels")}


def test_eval_retrieval_bm25_and_hybrid(tmp_path: Path, capsys) -> None:
    from encoderkit.embeddings.evaluation import retrieval_metrics

    paths = write_eval_set(tmp_path)
    files = ["--queries", paths["queries"], "--corpus", paths["corpus"], "--qrels", paths["qrels"]]
    assert main(["eval-retrieval", "--kind", "bm25", *files, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    index = BM25Index.build(DEMO_SENTENCES, [f"d{i}" for i in range(8)])
    questions = ["a guitarist playing music", "shares dropped after the news", "my cat naps in the sun",
                 "I need to reset my password"]
    found = index.search(questions, 100)
    qrels = {f"q{i + 1}": {f"d{2 * i}", f"d{2 * i + 1}"} for i in range(4)}
    expected = retrieval_metrics({f"q{i + 1}": found.ids[i] for i in range(4)}, qrels)
    assert got["queries"] == 4 and got["corpus"] == 8
    assert {k: got[k] for k in expected} == pytest.approx(expected)
    assert main(["eval-retrieval", "default", "--kind", "hybrid", *files, "--json"]) == 0
    hybrid = json.loads(capsys.readouterr().out)
    assert hybrid["recall@10"] == 1.0 and hybrid["ndcg@10"] > expected["ndcg@10"]
    assert main(["eval-retrieval", "default", "--kind", "bm25", *files]) == 2
    assert "leave MODEL out" in error_line(capsys)
    assert main(["eval-retrieval", "--kind", "hybrid", "--rerank", "x", *files]) == 2
    assert "--rerank is for --kind exact" in error_line(capsys)


@pytest.fixture(scope="module")
def splade_dir(tmp_path_factory, minilm_dir) -> Path:
    """A tiny random masked-LM (an MLM head over the MiniLM vocabulary): a SPLADE encoder of meaningless weights."""
    return tiny_bert_dir(tmp_path_factory.mktemp("splade") / "mlm", minilm_dir, task="masked-lm")


def test_sparse_index_search_and_eval_with_a_splade_model(tmp_path: Path, splade_dir: Path, minilm_dir: Path,
                                                          capsys) -> None:
    sparse = pytest.importorskip("encoderkit.embeddings.sparse")
    docs = write_jsonl(tmp_path / "docs.jsonl", DEMO_SENTENCES)
    assert main(["index", str(docs), "--kind", "sparse", "--model", str(splade_dir), "--out",
                 str(tmp_path / "sp")]) == 0
    index = load_index(tmp_path / "sp")
    assert isinstance(index, SparseIndex) and index.info["model"] == str(splade_dir)
    embedder = sparse.SparseEmbedder.from_pretrained(splade_dir)
    query = "a cat by the window"
    expected = index.search(embedder.encode_query([query]), 3)
    capsys.readouterr()
    assert main(["search", str(tmp_path / "sp"), query, "-k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert [h["id"] for h in hits] == expected.ids[0]
    dense = embedder.encode_query([query]).to_dense() @ embedder.encode_document(DEMO_SENTENCES).to_dense().T
    assert [h["score"] for h in hits] == pytest.approx(np.sort(dense[0])[::-1][:3].tolist(), rel=1e-4)
    assert main(["search", str(tmp_path / "sp"), query, "--model", str(minilm_dir)]) == 2
    line = error_line(capsys)
    assert f"built with the model {splade_dir}" in line and str(minilm_dir) in line
    paths = write_eval_set(tmp_path)
    assert main(["eval-retrieval", str(splade_dir), "--kind", "sparse", "--queries", paths["queries"], "--corpus",
                 paths["corpus"], "--qrels", paths["qrels"], "--json"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out)["ndcg@10"] <= 1


def test_multi_vector_index_search_and_eval_with_a_colbert_model(tmp_path: Path, minilm_dir: Path, capsys) -> None:
    multi_vector = pytest.importorskip("encoderkit.embeddings.multi_vector")
    pytest.importorskip("faiss")
    colbert = multi_vector.MultiVectorModel.from_pretrained(tiny_bert_dir(tmp_path / "base", minilm_dir),
                                                            dimension=16).save_pretrained(tmp_path / "colbert")
    docs = write_jsonl(tmp_path / "docs.jsonl", DEMO_SENTENCES)
    assert main(["index", str(docs), "--kind", "multi-vector", "--model", str(colbert), "--out", str(tmp_path / "mv"),
                 "--ivf-min-tokens", "0", "--nlist", "1", "--codec", "flat", "--store-dtype", "float16"]) == 0
    index = load_index(tmp_path / "mv")
    assert index.has_ivf and index.dtype == "float16" and index.info["model"] == str(colbert)
    query = "a cat by the window"
    embedder = multi_vector.MultiVectorEmbedder.from_pretrained(colbert)
    index.exact = True
    expected = index.search(embedder.encode([query], is_query=True), 3)
    capsys.readouterr()
    assert main(["search", str(tmp_path / "mv"), query, "-k", "3", "--json", "--nprobe", "1"]) == 0
    assert [h["id"] for h in json.loads(capsys.readouterr().out)] == expected.ids[0]
    paths = write_eval_set(tmp_path)
    assert main(["eval-retrieval", str(colbert), "--kind", "multi-vector", "--queries", paths["queries"], "--corpus",
                 paths["corpus"], "--qrels", paths["qrels"], "--json"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out)["ndcg@10"] <= 1
