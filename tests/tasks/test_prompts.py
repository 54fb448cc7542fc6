"""Prompts as sentence-transformers has them: named in config_sentence_transformers.json, one of them the default,
picked per call by prompt_name or given as text by prompt; the same vectors as SentenceTransformer.encode."""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from encoderkit import Embedder
from encoderkit.cli import cli
from encoderkit.errors import InputError

TEXTS = ["how do I reset my password", "The cat sat on the mat.", "a"]
PROMPTS = {"query": "query: ", "document": "passage: "}


@pytest.fixture(scope="module")
def prompted_dir(tmp_path_factory, minilm_dir) -> Path:
    directory = tmp_path_factory.mktemp("prompted") / "model"
    shutil.copytree(minilm_dir, directory)
    config_path = directory / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config.update(prompts=PROMPTS, default_prompt_name="query")
    config_path.write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def st_model(prompted_dir):
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(prompted_dir), device="cpu")


def test_vectors_equal_sentence_transformers_for_each_way_of_prompting(prompted_dir, st_model):
    embedder = Embedder.from_pretrained(prompted_dir)
    assert embedder.prompts == PROMPTS and embedder.default_prompt_name == "query"
    cases = [({}, {}), ({"prompt_name": "document"}, {"prompt_name": "document"}),
             ({"prompt": "search_query: "}, {"prompt": "search_query: "})]
    for ours, theirs in cases:
        np.testing.assert_allclose(embedder.encode(TEXTS, **ours), st_model.encode(TEXTS, **theirs), atol=1e-5)
    plain = Embedder.from_pretrained(prompted_dir, prompt="")  # an empty prompt: none at all
    np.testing.assert_allclose(plain.encode(TEXTS), st_model.encode(TEXTS, prompt=""), atol=1e-5)
    fixed = Embedder.from_pretrained(prompted_dir, prompt_name="document")  # every call, unless told otherwise
    np.testing.assert_allclose(fixed.encode(TEXTS), st_model.encode(TEXTS, prompt_name="document"), atol=1e-5)


def test_an_unknown_prompt_name_is_one_error(prompted_dir, tmp_path):
    embedder = Embedder.from_pretrained(prompted_dir)
    with pytest.raises(InputError, match=r"no prompt named 'qeury'.*query \('query: '\), document \('passage: '\)"):
        embedder.encode(TEXTS, prompt_name="qeury")
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    result = CliRunner().invoke(cli, ["embed", str(texts), "--out", str(tmp_path / "v.npy"), "--model",
                                      str(prompted_dir), "--prompt-name", "qeury"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("encoderkit: error:")]
    assert len(errors) == 1 and "qeury" in errors[0]


def test_cli_prompt_name_embeds_as_sentence_transformers(prompted_dir, st_model, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "v.npy"
    result = CliRunner().invoke(cli, ["embed", str(texts), "--out", str(out), "--model", str(prompted_dir),
                                      "--prompt-name", "document"])
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(np.load(out), st_model.encode(TEXTS, prompt_name="document"), atol=1e-5)


def test_the_server_takes_prompt_name(prompted_dir, st_model):
    from encoderkit.server.app import create_app
    from encoderkit.server.registry import ModelRegistry
    from serving import client_of

    registry = ModelRegistry.load([("prompted", prompted_dir)])

    async def go():
        async with client_of(create_app(registry)) as client:
            return [await client.post("/embed", json=body) for body in (
                {"inputs": TEXTS}, {"inputs": TEXTS, "prompt_name": "document"},
                {"inputs": TEXTS, "prompt_name": "nope"})]

    default, document, bad = asyncio.run(go())
    np.testing.assert_allclose(default.json(), st_model.encode(TEXTS, normalize_embeddings=True), atol=1e-5)
    np.testing.assert_allclose(document.json(), st_model.encode(TEXTS, prompt_name="document",
                                                                normalize_embeddings=True), atol=1e-5)
    assert bad.status_code == 422 and "no prompt named 'nope'" in bad.text


def test_eval_retrieval_prompts_equal_sentence_transformers_evaluator(prompted_dir, st_model, tmp_path):
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    from encoderkit.embeddings.evaluation import evaluate_retrieval

    queries = {"q1": "what do cats eat", "q2": "capital of france", "q3": "how tall is mount everest"}
    corpus = {"d1": "Cats are carnivores and eat meat.", "d2": "Paris is the capital of France.",
              "d3": "Everest is 8,849 metres high.", "d4": "Bananas are yellow.", "d5": "Dogs like to play."}
    qrels = {"q1": {"d1"}, "q2": {"d2"}, "q3": {"d3"}}
    evaluator = InformationRetrievalEvaluator(queries, corpus, qrels, query_prompt_name="query",
                                              corpus_prompt_name="document", name="p")
    theirs = evaluator(st_model)
    ours = evaluate_retrieval(Embedder.from_pretrained(prompted_dir), queries, corpus, qrels,
                              query_prompt_name="query", document_prompt_name="document")
    assert ours["ndcg@10"] == pytest.approx(theirs["p_cosine_ndcg@10"], abs=1e-6)
    assert ours["mrr@10"] == pytest.approx(theirs["p_cosine_mrr@10"], abs=1e-6)


def test_search_with_a_prompt_name_scores_as_the_prompted_query(prompted_dir, tmp_path):
    docs = ["Cats are carnivores and eat meat.", "Paris is the capital of France.", "Bananas are yellow."]
    source = tmp_path / "docs.txt"
    source.write_text("\n".join(docs) + "\n")
    runner = CliRunner()
    assert runner.invoke(cli, ["embed", str(source), "--out", str(tmp_path / "d.npy"), "--model", str(prompted_dir),
                               "--prompt-name", "document"]).exit_code == 0
    assert runner.invoke(cli, ["index", str(tmp_path / "d.npy"), "--out", str(tmp_path / "index"), "--model",
                               str(prompted_dir)]).exit_code == 0
    embedder = Embedder.from_pretrained(prompted_dir)
    vectors = np.load(tmp_path / "d.npy")
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for name in ("query", "document"):
        result = runner.invoke(cli, ["search", str(tmp_path / "index"), "what do cats eat", "--json", "-k", "3",
                                     "--prompt-name", name])
        assert result.exit_code == 0, result.output
        hits = json.loads(result.output)
        query = embedder.encode(["what do cats eat"], prompt_name=name, normalize=True)[0]
        expected = vectors @ query
        for hit in hits:
            assert hit["score"] == pytest.approx(float(expected[int(hit["id"])]), abs=1e-5)


def test_mining_scores_prompted_anchors_against_prompted_documents(prompted_dir):
    from encoderkit.embeddings.mining import mine_hard_negatives

    anchors = ["what do cats eat", "capital of france", "how tall is everest"]
    positives = ["Cats eat meat.", "Paris is the capital of France.", "Everest is 8,849 metres high."]
    corpus = ["Bananas are yellow.", "Dogs like to play.", "Rome is in Italy.", "Snow is cold."]
    embedder = Embedder.from_pretrained(prompted_dir)
    mined = mine_hard_negatives(embedder, anchors, positives, corpus, margin=None, num_negatives=1,
                                query_prompt_name="query", document_prompt_name="document")
    assert len(mined.examples) == 3
    a = embedder.encode(anchors, prompt_name="query", normalize=True)
    p = embedder.encode(positives, prompt_name="document", normalize=True)
    assert mined.positive_mean == pytest.approx(float((a * p).sum(axis=1).mean()), abs=1e-5)
    plain = mine_hard_negatives(embedder, anchors, positives, corpus, margin=None, num_negatives=1,
                                query_prompt="", document_prompt="")
    assert plain.positive_mean != pytest.approx(mined.positive_mean, abs=1e-4)  # the prompts did change the vectors
