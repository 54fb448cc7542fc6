"""The HTTP server's endpoints against independent references: /embed and /v1/embeddings against
sentence-transformers and the in-process Embedder, /rerank against sentence-transformers' CrossEncoder, /predict
against transformers' pipeline, and /ner, /qa, /fill-mask, /tokenize, /search, /info, /metrics in shape."""
from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from encoderkit.server import ModelRegistry, ServerSettings, create_app  # noqa: E402
from serving import NER_LABELS, client_of, metric, saved_index, tiny_models  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["A man is playing a guitar.", "The new movie is awesome, the best I have seen in years and years.",
         "hello", "Two dogs run across a snowy field while their owner throws a red ball for them."]
PASSAGES = ["Hamlet is a tragedy written by William Shakespeare.", "Bananas are rich in potassium.",
            "Shakespeare wrote plays in London.", "The violin has four strings."]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, minilm_dir):
    return tiny_models(tmp_path_factory.mktemp("served"), minilm_dir)


@pytest.fixture(scope="module")
def registry(model_dirs, minilm_dir, tmp_path_factory):
    index_dir = saved_index(tmp_path_factory.mktemp("index"), minilm_dir, PASSAGES)
    return ModelRegistry.load([(None, minilm_dir)] + [(name, path) for name, path in model_dirs.items()],
                              index=index_dir)


def call(registry, requests, settings=None):
    """Send (method, path, json) requests in order; the responses."""
    async def go():
        async with client_of(create_app(registry, settings or ServerSettings())) as client:
            return [await client.request(method, path, json=body) for method, path, body in requests]

    return asyncio.run(go())


def post(registry, path, body, settings=None):
    (response,) = call(registry, [("POST", path, body)], settings)
    return response


# ----- embeddings -------------------------------------------------------------------------------
def test_embed_equals_sentence_transformers(registry, minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
    batch, single = call(registry, [("POST", "/embed", {"inputs": TEXTS}), ("POST", "/embed", {"inputs": TEXTS[1]})])
    assert batch.status_code == 200 and single.status_code == 200
    np.testing.assert_allclose(np.array(batch.json()), reference, atol=1e-5)
    np.testing.assert_allclose(np.array(single.json()), reference[1:2], atol=1e-5)


def test_concurrent_mixed_length_requests_equal_the_embedder(registry, minilm_dir):
    """Requests batched together answer what the in-process Embedder gives each text alone, to 1e-6."""
    from encoderkit.tasks.embed import Embedder

    embedder = Embedder.from_pretrained(minilm_dir)
    texts = [" ".join(["word"] * n) + f" {i}" for i, n in enumerate([1, 40, 3, 120, 7, 60, 2, 200])]

    async def go():
        async with client_of(create_app(registry)) as client:
            return await asyncio.gather(*(client.post("/embed", json={"inputs": t}) for t in texts))

    responses = asyncio.run(go())
    got = np.array([r.json()[0] for r in responses])
    alone = np.stack([embedder.encode([t], normalize=True)[0] for t in texts])
    np.testing.assert_allclose(got, alone, atol=1e-6)


def test_embed_options_normalize_and_dimensions(registry, minilm_dir):
    from encoderkit.tasks.embed import Embedder

    raw = Embedder.from_pretrained(minilm_dir).encode(TEXTS, normalize=False)
    plain, short = call(registry, [("POST", "/embed", {"inputs": TEXTS, "normalize": False}),
                                   ("POST", "/embed", {"inputs": TEXTS, "dimensions": 64})])
    np.testing.assert_allclose(np.array(plain.json()), raw, atol=1e-5)
    cut = raw[:, :64] / np.linalg.norm(raw[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(np.array(short.json()), cut, atol=1e-5)


def test_openai_embeddings_schema_float_and_base64(registry, minilm_dir):
    from encoderkit.tasks.embed import Embedder

    reference = Embedder.from_pretrained(minilm_dir).encode(TEXTS, normalize=True)
    floats, coded = call(registry, [
        ("POST", "/v1/embeddings", {"input": TEXTS, "model": "all-MiniLM-L6-v2"}),
        ("POST", "/v1/embeddings", {"input": TEXTS, "encoding_format": "base64", "dimensions": 32})])
    body = floats.json()
    assert body["object"] == "list" and body["model"] == "all-MiniLM-L6-v2"
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3] and {d["object"] for d in body["data"]} == {"embedding"}
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]), reference, atol=1e-6)
    tokens = registry.get().tokenizer.encode_raw(TEXTS)
    assert body["usage"] == {"prompt_tokens": sum(len(e.ids) for e in tokens),
                             "total_tokens": sum(len(e.ids) for e in tokens)}
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in coded.json()["data"]])
    cut = reference[:, :32] / np.linalg.norm(reference[:, :32], axis=1, keepdims=True)
    np.testing.assert_allclose(decoded, cut, atol=1e-6)


# ----- cross-encoders and classifiers -----------------------------------------------------------------
def test_rerank_equals_cross_encoder(registry, model_dirs):
    st = pytest.importorskip("sentence_transformers")
    cross = st.CrossEncoder(str(model_dirs["rerank"]), device="cpu")
    query = "who wrote hamlet"
    expected = cross.predict([(query, p) for p in PASSAGES])  # one label: sigmoid
    response = post(registry, "/rerank", {"query": query, "texts": PASSAGES, "return_text": True, "model": "rerank"})
    assert response.status_code == 200
    ranked = response.json()
    assert [r["score"] for r in ranked] == sorted((r["score"] for r in ranked), reverse=True)
    assert sorted(r["index"] for r in ranked) == [0, 1, 2, 3]
    for row in ranked:
        assert row["text"] == PASSAGES[row["index"]]
        assert row["score"] == pytest.approx(float(expected[row["index"]]), abs=1e-5)
    raw = post(registry, "/rerank", {"query": query, "texts": PASSAGES, "raw_scores": True}).json()
    logits = np.log(expected / (1 - expected))
    for row in raw:  # the default model cannot rerank, so the first model that can answered
        assert "text" not in row and row["score"] == pytest.approx(float(logits[row["index"]]), abs=1e-4)


def test_rerank_scores_a_repeated_text_once_and_keeps_its_order(registry, model_dirs):
    st = pytest.importorskip("sentence_transformers")
    query, texts = "who wrote hamlet", [PASSAGES[1], PASSAGES[0], PASSAGES[1], PASSAGES[2], PASSAGES[1]]
    expected = st.CrossEncoder(str(model_dirs["rerank"]), device="cpu").predict([(query, t) for t in texts])
    ranked = post(registry, "/rerank", {"query": query, "texts": texts, "model": "rerank"}).json()
    by_index = {row["index"]: row["score"] for row in ranked}
    assert by_index[0] == by_index[2] == by_index[4]  # equal texts, bit-equal scores
    assert [row["index"] for row in ranked if row["index"] in (0, 2, 4)] == [0, 2, 4]  # ties keep input order
    for index, score in by_index.items():
        assert score == pytest.approx(float(expected[index]), abs=1e-5)


def test_predict_equals_transformers_pipeline(registry, model_dirs):
    transformers = pytest.importorskip("transformers")
    classify = transformers.pipeline("text-classification", model=str(model_dirs["sentiment"]), device="cpu",
                                     top_k=None)
    one, pair, batch = call(registry, [
        ("POST", "/predict", {"inputs": TEXTS[0], "model": "sentiment"}),
        ("POST", "/predict", {"inputs": [TEXTS[0], TEXTS[1]], "model": "sentiment"}),
        ("POST", "/predict", {"inputs": [[TEXTS[2]], [TEXTS[0], TEXTS[3]]], "model": "sentiment"})])

    def check(answer, expected):
        expected = expected[0] if isinstance(expected[0], list) else expected  # one input: a list of one list
        assert [p["label"] for p in answer] == [p["label"] for p in expected]
        np.testing.assert_allclose([p["score"] for p in answer], [p["score"] for p in expected], atol=1e-5)

    check(one.json(), classify(TEXTS[0]))
    check(pair.json(), classify({"text": TEXTS[0], "text_pair": TEXTS[1]}))
    assert len(batch.json()) == 2
    check(batch.json()[0], classify(TEXTS[2]))
    check(batch.json()[1], classify({"text": TEXTS[0], "text_pair": TEXTS[3]}))


# ----- NER, QA, fill-mask -----------------------------------------------------------------------------
def test_ner_qa_fill_mask_answer_as_the_pipelines(registry):
    ner_text = "John Smith flew from Paris to Berlin on Monday."
    context = "The Eiffel Tower is in Paris. It was completed in 1889 by Gustave Eiffel's company."
    masked = "The capital of France is [MASK]."
    ner, qa, fill, two_masks = call(registry, [
        ("POST", "/ner", {"inputs": ner_text, "model": "ner"}),
        ("POST", "/qa", {"question": "When was it completed?", "context": context}),
        ("POST", "/fill-mask", {"inputs": masked, "top_k": 3}),
        ("POST", "/fill-mask", {"inputs": "[MASK] is the capital of [MASK].", "top_k": 2})])
    entities = registry.get("ner").pipeline("ner")(ner_text)
    assert ner.json() == [{"label": e.type, "text": e.text, "start": e.start, "end": e.end,
                           "score": pytest.approx(e.score, abs=1e-6)} for e in entities]
    for entity in ner.json():
        assert ner_text[entity["start"]:entity["end"]] == entity["text"]
        assert entity["label"] in {label[2:] for label in NER_LABELS.values() if label != "O"}
    (best,) = registry.get("qa").pipeline("qa")("When was it completed?", context, top_k=1)
    assert qa.json() == {"answer": best.text, "start": best.start, "end": best.end,
                         "score": pytest.approx(best.score, abs=1e-6)}
    assert context[best.start:best.end] == best.text
    (per_mask,) = registry.get("mlm").pipeline("fill-mask")(masked, top_k=3)
    assert fill.json() == [{"token": p.token_id, "token_str": p.token, "score": pytest.approx(p.score, abs=1e-6),
                            "sequence": p.sequence} for p in per_mask[0]]
    assert len(two_masks.json()) == 2 and all(len(m) == 2 for m in two_masks.json())


def test_fill_mask_needs_a_mask_and_ner_takes_batches(registry):
    no_mask, batch = call(registry, [("POST", "/fill-mask", {"inputs": "no mask here"}),
                                     ("POST", "/ner", {"inputs": ["Anna lives in Rome.", "Bob."]})])
    assert no_mask.status_code == 422 and "[MASK]" in no_mask.json()["error"]
    assert batch.status_code == 200 and len(batch.json()) == 2


# ----- tokens, search, info -----------------------------------------------------------------------------
def test_tokenize_has_tei_shape(registry):
    text = "Hello, world!"
    with_specials, without = call(registry, [("POST", "/tokenize", {"inputs": text}),
                                             ("POST", "/tokenize", {"inputs": [text], "add_special_tokens": False})])
    tokens = with_specials.json()[0]
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[-1]["special"] and tokens[-1]["text"] == "[SEP]"
    for token in tokens[1:-1]:
        assert not token["special"] and text[token["start"]:token["stop"]] == token["text"]
    assert [t["text"] for t in tokens[1:-1]] == ["Hello", ",", "world", "!"]
    assert without.json()[0] == tokens[1:-1]


def test_search_finds_the_nearest_text(registry, minilm_dir):
    from encoderkit.tasks.embed import Embedder

    response = post(registry, "/search", {"query": "Who wrote Hamlet?", "k": 2})
    assert response.status_code == 200
    hits = response.json()
    assert [h["id"] for h in hits][0] == "doc0" and hits[0]["text"] == PASSAGES[0] and len(hits) == 2
    embedder = Embedder.from_pretrained(minilm_dir)
    expected = embedder.encode(["Who wrote Hamlet?"], normalize=True) @ embedder.encode(PASSAGES, normalize=True).T
    assert hits[0]["score"] == pytest.approx(float(expected[0, 0]), abs=1e-5)


def test_search_without_an_index_is_404(minilm_dir):
    registry = ModelRegistry.load([(None, minilm_dir)])
    response = post(registry, "/search", {"query": "anything"})
    assert response.status_code == 404 and "--index" in response.json()["error"]
    assert response.json()["error_type"] == "NotFound"


def test_info_lists_models_kinds_and_endpoints(registry):
    (info,) = call(registry, [("GET", "/info", None)])
    body = info.json()
    assert body["default_model"] == "all-MiniLM-L6-v2" == body["model_id"]
    models = {m["name"]: m for m in body["models"]}
    assert list(models) == ["all-MiniLM-L6-v2", "rerank", "sentiment", "ner", "qa", "mlm"]
    embedder = models["all-MiniLM-L6-v2"]
    assert embedder["family"] == "bert" and embedder["dimensions"] == 384 and embedder["max_input_length"] == 256
    assert embedder["pooling"] == "mean" and embedder["normalize"] is True and embedder["dtype"] == "float32"
    assert embedder["endpoints"] == ["/embed", "/v1/embeddings", "/embed_all", "/tokenize", "/search"]
    assert models["rerank"]["kinds"] == ["predict", "rerank"] and models["sentiment"]["kinds"] == ["predict"]
    assert models["sentiment"]["labels"] == ["negative", "neutral", "positive"]
    assert models["mlm"]["endpoints"] == ["/embed_sparse", "/fill-mask", "/tokenize"]
    assert body["index"]["count"] == 4 and body["index"]["model"] == "all-MiniLM-L6-v2"
    assert "path" not in str(body["models"])  # the server's files are not shown
    assert registry.kinds("ner") == {"ner"} and registry.path("qa").is_dir() and registry.index_path.is_dir()


def test_a_model_without_the_head_is_told_what_it_serves(registry):
    wrong, unknown, a_path = call(registry, [
        ("POST", "/embed", {"inputs": "x", "model": "sentiment"}),
        ("POST", "/embed", {"inputs": "x", "model": "gpt-17"}),
        ("POST", "/embed", {"inputs": "x", "model": str(registry.path("all-MiniLM-L6-v2"))})])
    assert wrong.status_code == 400
    assert "'sentiment'" in wrong.json()["error"] and "/predict" in wrong.json()["error"]
    assert "all-MiniLM-L6-v2" in wrong.json()["error"]  # the models that can
    assert unknown.status_code == 404 and "all-MiniLM-L6-v2, rerank" in unknown.json()["error"]
    assert a_path.status_code == 404  # a path names no model: only the start-up names do


def test_health_metrics_and_openapi(registry):
    health, embed, metrics, openapi, docs = call(registry, [
        ("GET", "/health", None), ("POST", "/embed", {"inputs": ["a", "b"]}), ("GET", "/metrics", None),
        ("GET", "/openapi.json", None), ("GET", "/docs", None)])
    assert health.status_code == 200 and embed.status_code == 200
    text = metrics.text
    assert metrics.headers["content-type"].startswith("text/plain")
    assert metric(text, "encoderkit_requests_total", route="/embed", status="200") == 1
    assert metric(text, "encoderkit_request_duration_seconds_count", route="/embed") == 1
    assert metric(text, "encoderkit_batch_size_sum", model="all-MiniLM-L6-v2", kind="embed") == 2
    assert "# TYPE encoderkit_queue_depth gauge" in text and "# TYPE encoderkit_batch_size histogram" in text
    assert metric(text, "encoderkit_queue_depth", model="all-MiniLM-L6-v2", kind="embed") == 0
    paths = openapi.json()["paths"]
    for path in ("/embed", "/v1/embeddings", "/rerank", "/predict", "/ner", "/qa", "/fill-mask", "/tokenize",
                 "/search", "/health", "/info", "/metrics"):
        assert path in paths, path
    schema = paths["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"inputs", "normalize", "truncate", "dimensions"} <= set(schema["properties"])
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_models_are_loaded_and_run_on_the_compute_thread(registry, minilm_dir):
    """The server's model work runs on the process's compute thread (encoderkit.threads), the thread that
    loaded the models: a second thread running torch would start a second OpenMP team and slow both."""
    import threading

    from encoderkit.threads import THREAD_NAME, on_compute_thread

    embedder = registry.get(None).pipelines["embed"]
    loaded_on = on_compute_thread(threading.current_thread)
    ran_on = []
    pooled = embedder.engine.pooled

    def recorded(*args, **kwargs):
        ran_on.append(threading.current_thread())
        return pooled(*args, **kwargs)

    embedder.engine.pooled = recorded
    try:
        response = post(registry, "/embed", {"inputs": TEXTS[:2]})
    finally:
        del embedder.engine.pooled
    assert response.status_code == 200
    assert ran_on and all(thread is loaded_on for thread in ran_on) and loaded_on.name.startswith(THREAD_NAME)


def test_the_registry_loads_on_the_compute_thread(monkeypatch):
    import threading

    from encoderkit.server import registry as registry_module
    from encoderkit.threads import THREAD_NAME

    threads = []
    monkeypatch.setattr(registry_module, "load_served_model",
                        lambda *args, **kwargs: threads.append(threading.current_thread().name))
    monkeypatch.setattr(registry_module.ModelRegistry, "__init__", lambda self, served: None)
    ModelRegistry.load([("a", "first"), ("b", "second")])
    assert len(threads) == 2 and all(name.startswith(THREAD_NAME) for name in threads), threads


def test_models_list_and_the_names_a_request_may_use(registry):
    """GET /v1/models lists the served names (OpenAI's shape); the default model also answers to "default" and
    its hub id; an unknown name is a 4xx naming the served ones."""
    listed, by_alias, by_hub_id, unknown = call(registry, [
        ("GET", "/v1/models", None),
        ("POST", "/v1/embeddings", {"input": "hello", "model": "default"}),
        ("POST", "/v1/embeddings", {"input": "hello", "model": "sentence-transformers/all-MiniLM-L6-v2"}),
        ("POST", "/v1/embeddings", {"input": "hello", "model": "nope"})])
    assert listed.status_code == 200 and listed.json()["object"] == "list"
    assert [m["id"] for m in listed.json()["data"]] == registry.names()
    assert all(m["object"] == "model" for m in listed.json()["data"])
    direct = post(registry, "/v1/embeddings", {"input": "hello", "model": registry.default})
    for response in (by_alias, by_hub_id):
        assert response.status_code == 200
        assert response.json()["data"][0]["embedding"] == direct.json()["data"][0]["embedding"]
    assert 400 <= unknown.status_code < 500 and registry.default in unknown.text
