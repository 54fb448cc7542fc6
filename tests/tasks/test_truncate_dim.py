"""Matryoshka truncation (``truncate_dim`` / ``--truncate-dim``): vectors equal sentence-transformers' truncate_dim with
and without normalisation; an index built with --truncate-dim records it and `search` cuts its queries to match;
eval-retrieval equals sentence-transformers' evaluator at the same dimension; bad values are one line and exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from encoderkit import Embedder, InputError
from encoderkit.cli import cli
from encoderkit.jobs import DEMO_SENTENCES

from helpers import tiny_bert_dir

TEXTS = ["A man is playing a guitar on stage.", "a short one", "",
         "a considerably longer sentence about something else entirely, with a clause or two added to it"]
QA = {"q1": ("what is the capital of france", "Paris is the capital of France."),
      "q2": ("who wrote hamlet", "Hamlet was written by William Shakespeare."),
      "q3": ("what do bees make", "Bees make honey from nectar."),
      "q4": ("how fast does light travel", "Light travels at about 300,000 km per second."),
      "q5": ("which is the largest planet", "Jupiter is the largest planet of the solar system.")}


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="encoderkit")


def one_error_line(result: Result) -> str:
    """The single `encoderkit: error:` line of a command that failed with exit code 2."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("encoderkit: error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def st_model(minilm_dir: Path):
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.fixture(scope="module")
def embedder(minilm_dir: Path) -> Embedder:
    return Embedder.from_pretrained(minilm_dir)


@pytest.mark.parametrize("dim", [128, 64])
def test_vectors_equal_sentence_transformers(st_model, embedder: Embedder, minilm_dir: Path, dim: int) -> None:
    from sentence_transformers import SentenceTransformer

    truncated = Embedder.from_pretrained(minilm_dir, truncate_dim=dim)
    assert truncated.dimension == dim and embedder.dimension == 384
    # the model's Normalize module runs on the full vector, before the cut: the cut vectors are not unit length
    theirs = st_model.encode(TEXTS, truncate_dim=dim)
    ours = truncated.encode(TEXTS)
    assert ours.shape == theirs.shape == (len(TEXTS), dim)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    np.testing.assert_allclose(embedder.encode(TEXTS, truncate_dim=dim), theirs, atol=1e-5)
    assert np.linalg.norm(ours, axis=1).max() < 0.99
    # normalize_embeddings=True: unit length after the cut
    theirs = st_model.encode(TEXTS, truncate_dim=dim, normalize_embeddings=True)
    np.testing.assert_allclose(truncated.encode(TEXTS, normalize=True), theirs, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1.0, atol=1e-5)
    # normalisation off: sentence-transformers without its Normalize module
    plain = SentenceTransformer(modules=[st_model[0], st_model[1]], device="cpu", truncate_dim=dim)
    theirs = plain.encode(TEXTS)
    np.testing.assert_allclose(truncated.encode(TEXTS, normalize=False), theirs, atol=1e-5)
    np.testing.assert_allclose(Embedder.from_pretrained(minilm_dir, normalize=False, truncate_dim=dim).encode(TEXTS),
                               theirs, atol=1e-5)
    single = truncated.encode(TEXTS[0], convert_to="torch")
    assert tuple(single.shape) == (dim,) and single.is_contiguous()


@pytest.mark.parametrize("value", [0, -1, 385, True, 1.5, "64"])
def test_bad_truncate_dim_is_an_input_error(embedder: Embedder, minilm_dir: Path, value) -> None:
    with pytest.raises(InputError, match=r"--truncate-dim\) must be an integer from 1 to the model's dimension 384"):
        embedder.encode(["x"], truncate_dim=value)
    with pytest.raises(InputError, match="from 1 to the model's dimension 384"):
        Embedder(embedder.model, embedder.tokenizer, truncate_dim=value)


def test_index_with_truncate_dim_searched_end_to_end(tmp_path: Path, embedder: Embedder, minilm_dir: Path) -> None:
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(DEMO_SENTENCES) + "\n", encoding="utf-8")
    query = "feline resting near the glass"
    full = embedder.encode(DEMO_SENTENCES)
    wanted = embedder.encode(query, truncate_dim=64, normalize=True) @ \
        (full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)).T
    order = np.argsort(-wanted)[:3]

    assert invoke("embed", docs, "--out", tmp_path / "full.npy").exit_code == 0
    assert invoke("embed", docs, "--out", tmp_path / "cut.npy", "--truncate-dim", 64).exit_code == 0
    assert np.load(tmp_path / "cut.npy").shape == (len(DEMO_SENTENCES), 64)
    np.testing.assert_allclose(np.load(tmp_path / "cut.npy"), full[:, :64], atol=1e-6)
    for vectors in ("full.npy", "cut.npy"):  # full vectors are cut by the index; cut ones are taken as they are
        index = tmp_path / f"idx-{vectors}"
        built = invoke("index", tmp_path / vectors, "--out", index, "--texts", docs, "--truncate-dim", 64)
        assert built.exit_code == 0, built.output
        assert f"indexed {len(DEMO_SENTENCES)} x 64 vectors" in built.stdout
        meta = json.loads((index / "index.json").read_text())
        assert meta["dimension"] == 64 and meta["info"]["truncate_dim"] == 64
        result = invoke("search", index, query, "-k", 3, "--json")
        assert result.exit_code == 0, result.output
        hits = json.loads(result.stdout)
        assert [h["row"] for h in hits] == order.tolist()
        assert {h["text"] for h in hits[:2]} == {DEMO_SENTENCES[4], DEMO_SENTENCES[5]}  # the two cat sentences
        assert [h["score"] for h in hits] == pytest.approx(wanted[order].tolist(), abs=1e-5)
        assert invoke("search", index, query, "--truncate-dim", 64).exit_code == 0  # the index's own: accepted

    # at query time: another dimension, or a model narrower than the index's cut, is one clear line
    message = one_error_line(invoke("search", tmp_path / "idx-cut.npy", query, "--truncate-dim", 128))
    assert "--truncate-dim 128 does not match the index" in message and "built with --truncate-dim 64" in message
    tiny = tiny_bert_dir(tmp_path / "tiny", minilm_dir)
    message = one_error_line(invoke("search", tmp_path / "idx-cut.npy", query, "--model", tiny))
    assert "built with --truncate-dim 64, but the model gives 32-dim vectors" in message
    # cut vectors indexed without --truncate-dim: refused when built, with the fix named
    message = one_error_line(invoke("index", tmp_path / "cut.npy", "--out", tmp_path / "idx-bad"))
    assert "holds 64-dim vectors but the query model" in message and "pass --truncate-dim 64" in message
    assert not (tmp_path / "idx-bad").exists()


def test_eval_retrieval_equals_sentence_transformers_evaluator(tmp_path: Path, st_model, minilm_dir: Path) -> None:
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    queries = {qid: q for qid, (q, _) in QA.items()}
    corpus = {f"d{qid}": p for qid, (_, p) in QA.items()}
    corpus.update({"x1": "The violin has four strings.", "x2": "France is a country in Europe.",
                   "x3": "Shakespeare was born in Stratford."})
    qrels = {qid: {f"d{qid}"} for qid in QA}
    evaluator = InformationRetrievalEvaluator(queries, corpus, qrels, mrr_at_k=[10], ndcg_at_k=[10],
                                              accuracy_at_k=[1], precision_recall_at_k=[1, 10, 100], map_at_k=[100],
                                              show_progress_bar=False, truncate_dim=32)
    reference = evaluator(st_model)
    name = next(k for k in reference if k.endswith("_ndcg@10")).split("_ndcg@10")[0]
    (tmp_path / "q.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in queries.items()), encoding="utf-8")
    (tmp_path / "c.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in corpus.items()), encoding="utf-8")
    (tmp_path / "r.tsv").write_text("".join(f"{q}\t{d}\n" for q, ds in qrels.items() for d in ds), encoding="utf-8")
    result = invoke("eval-retrieval", minilm_dir, "--queries", tmp_path / "q.tsv", "--corpus", tmp_path / "c.tsv",
                    "--qrels", tmp_path / "r.tsv", "--truncate-dim", 32, "--json")
    assert result.exit_code == 0, result.output
    ours = json.loads(result.stdout)
    for metric in ("ndcg@10", "mrr@10", "recall@1", "recall@10", "map@100"):
        assert ours[metric] == pytest.approx(reference[f"{name}_{metric}"], abs=1e-6), metric


@pytest.mark.parametrize("command", ["embed", "index", "eval-retrieval", "eval-sts"])
@pytest.mark.parametrize("value", ["0", "-4", "33"])
def test_bad_values_exit_2(tmp_path: Path, minilm_dir: Path, command: str, value: str) -> None:
    tiny = tiny_bert_dir(tmp_path / "tiny", minilm_dir)  # hidden size 32
    texts = tmp_path / "t.tsv"
    texts.write_text("q1\twhat is it\n", encoding="utf-8")
    if command == "embed":
        args = ["embed", texts, "--out", tmp_path / "o.npy", "--model", tiny, "--format", "text"]
    elif command == "index":
        np.save(tmp_path / "v.npy", np.ones((2, 32), dtype=np.float32))
        args = ["index", tmp_path / "v.npy", "--out", tmp_path / "idx", "--model", tiny]
    elif command == "eval-retrieval":
        (tmp_path / "r.tsv").write_text("q1\tq1\n", encoding="utf-8")
        args = ["eval-retrieval", tiny, "--queries", texts, "--corpus", texts, "--qrels", tmp_path / "r.tsv"]
    else:
        (tmp_path / "sts.tsv").write_text("".join(f"g\tf\t{i}\t{i}\t{i}.0\ta{i}\tb{i}\n" for i in range(3)),
                                          encoding="utf-8")
        args = ["eval-sts", tmp_path / "sts.tsv", "--model", tiny]
    message = one_error_line(invoke(*args, "--truncate-dim", value))
    assert f"must be an integer from 1 to the model's dimension 32, found {value}" in message
    assert not (tmp_path / "o.npy").exists() and not (tmp_path / "idx").exists()
