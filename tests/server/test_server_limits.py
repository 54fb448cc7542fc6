"""The server's limits, security and batching: every bad request gets its status and a message that names the
problem, and the next good request succeeds; concurrent requests share batches under the token budget; a client
that hangs up cancels its queued work."""
from __future__ import annotations

import asyncio

import numpy as np

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from encoderkit.server import ModelRegistry, ServerSettings, create_app  # noqa: E402
from serving import (Gate, behind_a_busy_model, busy_model, client_of, hang_up_call, metric, tiny_models,  # noqa: E402
                     wait_for)

pytestmark = pytest.mark.usefixtures("one_thread")

GOOD = {"inputs": ["a good request"]}
EMBEDDER = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def registry(minilm_dir, tmp_path_factory):
    dirs = tiny_models(tmp_path_factory.mktemp("served"), minilm_dir)
    return ModelRegistry.load([(None, minilm_dir), ("rerank", dirs["rerank"])])


def exchange(registry, requests, settings=None, headers=None):
    """Send (method, path, keyword arguments of httpx's request) in order; then a good /embed. Returns the
    responses; asserts the good one succeeded (the server kept serving)."""
    async def go():
        app = create_app(registry, settings or ServerSettings())
        async with client_of(app, headers) as client:
            answers = [await client.request(method, path, **options) for method, path, options in requests]
            after = await client.post("/embed", json=GOOD)
            assert after.status_code == 200, after.text
            return answers

    return asyncio.run(go())


def error_of(response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"}
    for word in words:
        assert word in body["error"], body["error"]
    return body["error"]


# ----- 422: wrong or empty values name their field -----------------------------------------------------
@pytest.mark.parametrize("path, body, field", [
    ("/embed", {"inputs": 5}, "inputs"),
    ("/embed", {"inputs": []}, "inputs"),
    ("/embed", {"inputs": ""}, "inputs"),
    ("/embed", {"inputs": ["fine", 3]}, "inputs[1]"),
    ("/embed", {"inputs": ["fine", ""]}, "inputs[1]"),
    ("/embed", {"normalize": True}, "inputs"),
    ("/embed", {"inputs": "x", "normalize": "yes"}, "normalize"),
    ("/embed", {"inputs": "x", "dimensions": 0}, "dimensions"),
    ("/embed", {"inputs": "x", "dimensions": 5.5}, "dimensions"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ("/rerank", {"query": "q", "texts": "not a list"}, "texts"),
    ("/rerank", {"query": "", "texts": ["a"]}, "query"),
    ("/predict", {"inputs": ["a", "b", "c"]}, "inputs"),
    ("/tokenize", {"inputs": None}, "inputs"),
    ("/embed", [1, 2], "body"),
])
def test_422_names_the_field(registry, path, body, field):
    (response,) = exchange(registry, [("POST", path, {"json": body})])
    message = error_of(response, 422, field)
    assert response.json()["error_type"] == "Validation"
    assert message.startswith(field) or f" {field}" in message or f"{field}:" in message


# ----- 400: not JSON, not UTF-8 -------------------------------------------------------------------------
@pytest.mark.parametrize("content, words", [
    (b'{"inputs": ["unterminated"', ("not valid JSON",)),
    (b'{"inputs": "caf\xe9"}', ("not valid UTF-8",)),
    (b"", ("empty",)),
    (b"inputs=hello", ("not valid JSON",)),
])
def test_400_for_malformed_bodies(registry, content, words):
    (response,) = exchange(registry, [("POST", "/embed", {"content": content,
                                                          "headers": {"content-type": "application/json"}})])
    error_of(response, 400, *words)


# ----- 413: body size, inputs per request, tokens per text ----------------------------------------------
def test_413_for_a_large_body_declared_or_streamed(registry):
    settings = ServerSettings(payload_limit=200)
    big = {"inputs": ["many words " * 30]}

    async def chunks():  # no Content-Length: the limit applies while reading
        yield b'{"inputs": ["'
        for _ in range(50):
            yield b"word " * 10
        yield b'"]}'

    declared, streamed = exchange(registry, [("POST", "/embed", {"json": big}),
                                             ("POST", "/embed", {"content": chunks()})], settings)
    error_of(declared, 413, "200 bytes", "--payload-limit")
    error_of(streamed, 413, "200 bytes")


def test_413_for_too_many_inputs(registry):
    settings = ServerSettings(max_client_batch_size=2)
    embed, rerank = exchange(registry, [("POST", "/embed", {"json": {"inputs": ["a", "b", "c"]}}),
                                        ("POST", "/rerank", {"json": {"query": "q", "texts": ["a", "b", "c"]}})],
                             settings)
    error_of(embed, 413, "inputs", "3 inputs", "at most 2", "--max-client-batch-size")
    error_of(rerank, 413, "texts", "at most 2")


def test_413_for_a_long_text_unless_truncated(registry, minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    long_text = "the quick brown fox jumps over the lazy dog " * 40  # ~360 tokens; the model reads 256
    refused, truncated = exchange(registry, [
        ("POST", "/embed", {"json": {"inputs": ["short", long_text]}}),
        ("POST", "/embed", {"json": {"inputs": ["short", long_text], "truncate": True}})])
    error_of(refused, 413, "inputs[1]", "tokens long", "at most 256", "truncate")
    reference = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(["short", long_text],
                                                                             normalize_embeddings=True)
    assert truncated.status_code == 200
    import numpy as np

    np.testing.assert_allclose(np.array(truncated.json()), reference, atol=1e-5)


# ----- 401: the API key ---------------------------------------------------------------------------------
def test_401_without_the_key_on_every_route_but_health(registry):
    settings = ServerSettings(api_key="s3cret")
    key = {"Authorization": "Bearer s3cret"}

    async def go():
        async with client_of(create_app(registry, settings)) as client:
            answers = {
                "none": await client.post("/embed", json=GOOD),
                "wrong": await client.post("/embed", json=GOOD, headers={"Authorization": "Bearer nope"}),
                "basic": await client.post("/embed", json=GOOD, headers={"Authorization": "Basic s3cret"}),
                "info": await client.get("/info"),
                "metrics": await client.get("/metrics"),
                "docs": await client.get("/openapi.json"),
                "health": await client.get("/health"),
                "keyed": await client.post("/embed", json=GOOD, headers=key),
                "keyed info": await client.get("/info", headers=key),
            }
            return answers

    answers = asyncio.run(go())
    for name in ("none", "wrong", "basic", "info", "metrics", "docs"):
        error_of(answers[name], 401, "Authorization: Bearer")
        assert answers[name].headers["www-authenticate"] == "Bearer"
    assert answers["health"].status_code == 200
    assert answers["keyed"].status_code == 200 and answers["keyed info"].status_code == 200


def test_no_cors_by_default_and_the_given_origins_only(registry):
    origin = {"Origin": "http://studio.example"}
    (plain,) = exchange(registry, [("POST", "/embed", {"json": GOOD, "headers": origin})])
    assert "access-control-allow-origin" not in plain.headers
    settings = ServerSettings(cors_origins=("http://studio.example",))
    allowed, other = exchange(registry, [
        ("POST", "/embed", {"json": GOOD, "headers": origin}),
        ("POST", "/embed", {"json": GOOD, "headers": {"Origin": "http://elsewhere.example"}})], settings)
    assert allowed.headers["access-control-allow-origin"] == "http://studio.example"
    assert "access-control-allow-origin" not in other.headers
    keyed = ServerSettings(cors_origins=("http://studio.example",), api_key="k")
    preflight = {**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization",
                 "Authorization": ""}  # no key
    (answer,) = exchange(registry, [("OPTIONS", "/embed", {"headers": preflight})], keyed,
                         headers={"Authorization": "Bearer k"})
    assert answer.status_code == 200  # a browser's preflight carries no key: answered before the key is asked for
    assert answer.headers["access-control-allow-origin"] == "http://studio.example"


# ----- 429 and 504: concurrency and time ----------------------------------------------------------------
def test_429_with_retry_after_beyond_the_concurrency_limit(registry):
    settings = ServerSettings(max_concurrent_requests=2)

    async def go():
        app = create_app(registry, settings)
        async with client_of(app) as client:
            batcher = app.state.server.batchers[(EMBEDDER, "embed")]
            async with busy_model(batcher, client):  # one request in flight
                second = asyncio.ensure_future(client.post("/embed", json={"inputs": "two"}))
                await wait_for(lambda: batcher.depth == 1, "the second request")
                refused = await client.post("/embed", json={"inputs": "three"})
                health = await client.get("/health")  # not an inference request: never refused
            return refused, health, await second, await client.post("/embed", json=GOOD)

    refused, health, second, after = asyncio.run(go())
    error_of(refused, 429, "limit of 2 concurrent requests")
    assert refused.headers["retry-after"] == "1" and refused.json()["error_type"] == "Overloaded"
    assert health.status_code == 200 and second.status_code == 200 and after.status_code == 200


def test_504_after_the_request_timeout_drops_the_queued_work(registry):
    settings = ServerSettings(request_timeout=0.5)

    async def go():
        app = create_app(registry, settings)
        async with client_of(app) as client:
            async with busy_model(app.state.server.batchers[(EMBEDDER, "embed")], client) as gate:
                late = await client.post("/embed", json={"inputs": ["waits", "too long"]})
            after = await client.post("/embed", json=GOOD)
            return late, after, (await client.get("/metrics")).text, gate.batches

    late, after, metrics, batches = asyncio.run(go())
    error_of(late, 504, "0.5 s", "--request-timeout")
    assert after.status_code == 200
    assert metric(metrics, "encoderkit_cancelled_items_total", model=EMBEDDER, kind="embed") == 2
    assert [len(batch) for batch in batches] == [1, 1]  # the busy one and GOOD: the timed-out texts never ran


# ----- dynamic batching ---------------------------------------------------------------------------------
def test_concurrent_requests_run_in_shared_batches(registry):
    async def go():
        app = create_app(registry)
        async with client_of(app) as client:
            queued = [("/embed", {"inputs": f"text number {i}"}) for i in range(12)]
            answers, batches = await behind_a_busy_model(app.state.server.batchers[(EMBEDDER, "embed")], client,
                                                         ("/embed", {"inputs": "first"}), queued, 12)
            return answers, (await client.get("/metrics")).text, batches

    answers, metrics, batches = asyncio.run(go())
    assert all(a.status_code == 200 for a in answers)
    assert [len(b) for b in batches] == [1, 12]  # 13 requests, 2 model calls
    assert metric(metrics, "encoderkit_batch_size_count", model=EMBEDDER, kind="embed") == 2
    assert metric(metrics, "encoderkit_batch_size_bucket", model=EMBEDDER, kind="embed", le="8") == 1
    assert metric(metrics, "encoderkit_batch_size_bucket", model=EMBEDDER, kind="embed", le="16") == 2


def test_batches_respect_the_token_budget_and_are_length_sorted(registry):
    budget = 200
    lengths = [5, 60, 8, 45, 3, 30, 70, 12, 50, 20]  # words: each about a token, plus [CLS] and [SEP]

    async def go():
        app = create_app(registry)
        async with client_of(app) as client:
            batcher = app.state.server.batchers[(EMBEDDER, "embed")]
            batcher.token_budget = budget
            queued = [("/embed", {"inputs": " ".join(["word"] * n)}) for n in lengths]
            return await behind_a_busy_model(batcher, client, ("/embed", {"inputs": "first"}), queued, len(lengths))

    answers, batches = asyncio.run(go())
    assert all(a.status_code == 200 for a in answers)
    queued = batches[1:]
    assert sum(len(b) for b in queued) == len(lengths) and len(queued) > 1
    for batch in queued:
        sizes = [len(ids) for ids, _ in batch]
        assert len(sizes) * max(sizes) <= budget, sizes
    # length-sorted: each batch holds a run of neighbouring lengths (no batch's range overlaps another's)
    ranges = sorted((min(len(i) for i, _ in b), max(len(i) for i, _ in b)) for b in queued)
    assert all(high < next_low for (_, high), (next_low, _) in zip(ranges, ranges[1:]))


def test_a_client_that_hangs_up_cancels_its_queued_work(registry):
    async def go():
        app = create_app(registry)
        async with client_of(app) as client:
            batcher = app.state.server.batchers[(EMBEDDER, "embed")]
            async with busy_model(batcher, client) as gate:
                hang_up = asyncio.Event()
                call = asyncio.ensure_future(hang_up_call(app, "/embed", {"inputs": ["gone 1", "gone 2", "gone 3"]},
                                                          hang_up))
                await wait_for(lambda: batcher.depth == 3, "the queued texts")
                hang_up.set()
                sent = await call
            after = await client.post("/embed", json=GOOD)
            return sent, after, (await client.get("/metrics")).text, gate.batches

    sent, after, metrics, batches = asyncio.run(go())
    assert not any(m.get("status") == 200 for m in sent)  # nobody was there to answer
    assert after.status_code == 200
    assert [len(b) for b in batches] == [1, 1]  # the busy one, then GOOD: the three texts never ran
    assert metric(metrics, "encoderkit_cancelled_items_total", model=EMBEDDER, kind="embed") == 3
    assert metric(metrics, "encoderkit_requests_total", route="/embed", status="499") == 1


def test_a_client_that_hangs_up_while_its_batch_runs_is_counted_and_the_server_goes_on(registry):
    async def go():
        app = create_app(registry)
        async with client_of(app) as client:
            batcher = app.state.server.batchers[(EMBEDDER, "embed")]
            gate = Gate(batcher)
            hang_up = asyncio.Event()
            call = asyncio.ensure_future(hang_up_call(app, "/embed", {"inputs": ["running 1", "running 2"]}, hang_up))
            await gate.entered()  # its own batch is on the model thread
            hang_up.set()
            await wait_for(lambda: batcher._pending == [] and call.done(), "the hung-up request to end")
            gate.open()
            await wait_for(lambda: "encoderkit_orphaned_items_total{" in app.state.server.metrics.render(),
                           "the batch to finish")
            after = await client.post("/embed", json=GOOD)
            return await call, after, (await client.get("/metrics")).text, gate.batches

    sent, after, metrics, batches = asyncio.run(go())
    assert not any(m.get("status") == 200 for m in sent)
    assert after.status_code == 200 and len(after.json()) == 1
    assert [len(b) for b in batches] == [2, 1]  # the hung-up request's batch had started: it ran, then GOOD
    assert metric(metrics, "encoderkit_orphaned_items_total", model=EMBEDDER, kind="embed") == 2
    assert metric(metrics, "encoderkit_cancelled_items_total", model=EMBEDDER, kind="embed") == 0


def test_rerank_and_predict_share_the_classifier_batches(registry):
    async def go():
        app = create_app(registry)
        async with client_of(app) as client:
            queued = [("/rerank", {"query": "q", "texts": ["a", "b"]}), ("/predict", {"inputs": [["x"], ["y", "z"]]})]
            return await behind_a_busy_model(app.state.server.batchers[("rerank", "classify")], client,
                                             ("/predict", {"inputs": "first"}), queued, 4)

    answers, batches = asyncio.run(go())
    assert [a.status_code for a in answers] == [200, 200]
    assert [len(b) for b in batches] == [1, 4]


def test_one_bad_item_in_a_batch_fails_only_its_own_request(registry):
    """An item the model cannot take (here: a run that raises on one sequence, as a kernel might on an input it
    was not built for) fails its request alone: the batch is retried by halves, the other requests of the same
    batch are answered 200 with their own vectors, and the server goes on serving."""
    poison = "poison " * 20

    async def go():
        app = create_app(registry)
        async with client_of(app, raise_app_exceptions=False) as client:
            batcher = app.state.server.batchers[(EMBEDDER, "embed")]
            embed = batcher.run
            poisoned_length = len(registry.get(EMBEDDER).tokenizer.encode(poison).input_ids)

            def run(items):
                if any(len(ids) == poisoned_length for ids, _ in items):
                    raise RuntimeError("this sequence cannot be embedded")
                return embed(items)

            batcher.run = run
            queued = [("/embed", {"inputs": poison if i == 3 else f"text number {i}"}) for i in range(8)]
            answers, batches = await behind_a_busy_model(batcher, client, ("/embed", {"inputs": "first"}), queued, 8)
            alone = [(await client.post("/embed", json=body)).json() for _, body in queued if body["inputs"] != poison]
            after = await client.post("/embed", json=GOOD)
            return answers, batches, alone, after

    answers, batches, alone, after = asyncio.run(go())
    assert [len(b) for b in batches[:2]] == [1, 8]  # the eight shared one batch, which failed
    assert answers[3].status_code == 500 and "cannot be embedded" in answers[3].json()["error"]
    good = [a for i, a in enumerate(answers) if i != 3]
    assert all(a.status_code == 200 for a in good), [a.text for a in good]
    for answer, single in zip(good, alone):  # each got its own vector, not a neighbour's
        assert abs(np.array(answer.json()) - np.array(single)).max() < 1e-5
    assert after.status_code == 200
