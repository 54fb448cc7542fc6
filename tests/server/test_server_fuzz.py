"""Property-based tests of the server's input handling (hypothesis): malformed bodies to every POST route.

Random JSON values of the wrong type or shape for each route's fields, random bytes, invalid UTF-8, deep nesting,
huge numbers, NaN and Infinity literals, empty bodies and wrong content types. Whatever arrives, the server answers
below 500 with the error body (``{"error": ..., "error_type": ...}``) when it refuses, and after each run of
examples a good request to the same route, and one to /embed, still succeed.

Every example is one request to the app in-process (httpx's ASGI transport, the app's lifespan around it) with
tiny models of every head beside the default embedder, and a search index, so each route reaches its own checks.
"""
from __future__ import annotations

import asyncio
import json
import os

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from encoderkit.server import ModelRegistry, ServerSettings, create_app  # noqa: E402
from encoderkit.server.schemas import (EmbedAllRequest, EmbedRequest, EmbedSparseRequest,  # noqa: E402
                                       FillMaskRequest, NerRequest, OpenAIEmbeddingRequest, PredictRequest, QaRequest, RerankRequest, SearchRequest, TokenizeRequest)
from encoderkit.server.studio import ATTENTION_PATH, AttentionRequest  # noqa: E402
from serving import client_of, saved_index, tiny_models  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

# route -> (its body's schema, a good body)
ROUTES = {
    "/embed": (EmbedRequest, {"inputs": ["a good request"]}),
    "/v1/embeddings": (OpenAIEmbeddingRequest, {"input": "a good request"}),
    "/rerank": (RerankRequest, {"query": "what is good", "texts": ["a good text", "another"], "model": "rerank"}),
    "/predict": (PredictRequest, {"inputs": "a good text", "model": "sentiment"}),
    "/ner": (NerRequest, {"inputs": "John lives in Paris", "model": "ner"}),
    "/qa": (QaRequest, {"question": "Where does John live?", "context": "John lives in Paris.", "model": "qa"}),
    "/fill-mask": (FillMaskRequest, {"inputs": "a [MASK] day", "model": "mlm", "top_k": 2}),
    "/embed_sparse": (EmbedSparseRequest, {"inputs": ["a good request"], "model": "mlm"}),
    "/embed_all": (EmbedAllRequest, {"inputs": ["a good request"]}),
    "/tokenize": (TokenizeRequest, {"inputs": "a good request"}),
    "/search": (SearchRequest, {"query": "a good request", "k": 2}),
    ATTENTION_PATH: (AttentionRequest, {"text": "a good request", "layer": 1, "head": 2}),
}
PATHS = list(ROUTES)
# ~50 examples per route and strategy, the same ones every run, keep the module under a minute. For a longer, random
# search: ENCODERKIT_FUZZ_EXAMPLES=2000 pytest tests/server/test_server_fuzz.py
EXAMPLES = int(os.environ.get("ENCODERKIT_FUZZ_EXAMPLES", "0")) or None
FUZZ = settings(max_examples=EXAMPLES or 50, deadline=None, derandomize=EXAMPLES is None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
CONTENT_TYPES = [None, "application/json", "application/json; charset=latin-1", "text/plain", "text/html",
                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz", "application/octet-stream",
                 "", "*/*", "application/json\x00"]


class Served:
    """The app on one event loop for the whole module: ``post`` sends one request and waits for its answer."""

    def __init__(self, app) -> None:
        self.loop = asyncio.new_event_loop()
        self.context = client_of(app)
        self.client = self.loop.run_until_complete(self.context.__aenter__())

    def post(self, path: str, content: bytes, content_type: str | None = "application/json"):
        headers = {} if content_type is None else {"content-type": content_type}
        return self.loop.run_until_complete(self.client.post(path, content=content, headers=headers))

    def close(self) -> None:
        self.loop.run_until_complete(self.context.__aexit__(None, None, None))
        self.loop.close()


@pytest.fixture(scope="module")
def server(minilm_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    dirs = tiny_models(root, minilm_dir)
    registry = ModelRegistry.load([(None, minilm_dir)] + list(dirs.items()),
                                  index=saved_index(root, minilm_dir, ["a first passage", "a second passage"]))
    app = create_app(registry, ServerSettings(max_client_batch_size=8, payload_limit=200_000))
    served = Served(app)
    served.routes = {path for path, operations in app.openapi()["paths"].items() if "post" in operations}
    yield served
    served.close()


def refused_cleanly(response) -> None:
    """Never a 5xx; a refusal is the server's JSON error body."""
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        body = response.json()
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
        assert isinstance(body.get("error_type"), str), body


def still_serving(server: Served, path: str) -> None:
    for where in dict.fromkeys([path, "/embed"]):
        good = server.post(where, json.dumps(ROUTES[where][1]).encode())
        assert good.status_code == 200, (where, good.status_code, good.text)


# ----- strategies ---------------------------------------------------------------------------------------
HUGE = st.sampled_from([10 ** 19, -(10 ** 19), 2 ** 63, -(2 ** 63) - 1, 10 ** 400, 1e308, -1e308, 5e-324])
TEXTS = st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "\x00", "[MASK]", "[CLS] [SEP]", "\ud800", "\ufeff",
                                                          "a" * 3000, "word " * 600, "\u0301" * 50]))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-3, 400), HUGE,
                    st.floats(allow_nan=True, allow_infinity=True), TEXTS)
JSON_VALUES = st.recursive(SCALARS, lambda children: st.one_of(
    st.lists(children, max_size=6), st.dictionaries(st.text(max_size=12), children, max_size=6)), max_leaves=25)
# values of about the right shape: texts, lists of texts (empty, too many, nested), small numbers
NEAR_VALUES = st.one_of(TEXTS, st.lists(TEXTS, max_size=12), st.lists(st.lists(TEXTS, max_size=3), max_size=4),
                        st.integers(-3, 1000), st.sampled_from(["float", "base64", "int8", "mlm", "ner", "qa", "rerank",
                                                                "sentiment", "all-MiniLM-L6-v2", "../../etc/passwd"]))


def dumps(value) -> bytes:
    """JSON with NaN and Infinity literals where the value holds them; lone surrogates escaped."""
    return json.dumps(value, allow_nan=True).encode("utf-8")


@st.composite
def wrong_bodies(draw, path: str):
    """The route's good body with one or more fields replaced by random values (of about the right shape, or any
    JSON value), sometimes one removed, plus stray fields."""
    schema, good = ROUTES[path]
    body = dict(good)
    fields = list(schema.model_fields)
    for name in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True)):
        action = draw(st.sampled_from(["near", "any", "near", "remove"]))
        if action == "remove":
            body.pop(name, None)
        else:
            body[name] = draw(NEAR_VALUES if action == "near" else JSON_VALUES)
    body.update(draw(st.dictionaries(st.text(max_size=8), SCALARS, max_size=2)))
    return body


def nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    if kind == "object":
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b'{"inputs": ' + b"[" * depth + b'"x"' + b"]" * depth + b"}"


RAW_BODIES = st.one_of(
    st.binary(max_size=200),
    st.just(b""), st.sampled_from([b" ", b"\n\t ", b"null", b"true", b"0", b'""', b"[]", b"{}", b"NaN", b"Infinity",
                                   b"-Infinity", b'{"inputs": NaN}', b'{"inputs": Infinity}', b'{"k": 1e999999}',
                                   b'{"inputs": "x"', b'{"inputs": "x"}}', b"\xef\xbb\xbf{}", b"\x00" * 10]),
    st.builds(nested, st.integers(1, 100_000), st.sampled_from(["list", "object", "inputs"])),
    # valid JSON with a byte that is not UTF-8 spliced in
    st.builds(lambda body, at, junk: body[:at % (len(body) + 1)] + junk + body[at % (len(body) + 1):],
              JSON_VALUES.map(dumps), st.integers(0, 10_000),
              st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])),
    # huge numbers written out
    st.builds(lambda field, digits: b'{"%s": %s}' % (field.encode(), digits.encode()),
              st.sampled_from(["inputs", "k", "top_k", "dimensions", "layer", "head"]),
              st.sampled_from(["1" * 5000, "-" + "9" * 400, "1e400", "-1e400", "1.5e-400", "0.0000", "-0"])),
)


# ----- the tests ----------------------------------------------------------------------------------------
def test_every_post_route_is_fuzzed(server):
    assert server.routes == set(ROUTES), "a POST route is missing from ROUTES (or gone from the app)"


def requests_of(kind: str, path: str):
    """(body, content type) pairs: the route's fields with wrong values, any JSON value, or bytes that are not
    a JSON body under any content type."""
    if kind == "wrong values":
        return st.tuples(wrong_bodies(path).map(dumps), st.just("application/json"))
    if kind == "any JSON":
        return st.tuples(JSON_VALUES.map(dumps), st.just("application/json"))
    return st.tuples(RAW_BODIES, st.sampled_from(CONTENT_TYPES))


@pytest.mark.parametrize("kind", ["wrong values", "any JSON", "not a body"])
@pytest.mark.parametrize("path", PATHS)
def test_malformed_requests(server, path, kind):
    @FUZZ
    @given(request=requests_of(kind, path))
    def check(request):
        refused_cleanly(server.post(path, *request))

    check()
    still_serving(server, path)


def test_nan_and_huge_numbers_name_the_field(server):
    """A few cases by hand: non-finite and out-of-range numbers are 4xx naming the field."""
    for path, body, field in [("/embed", b'{"inputs": "x", "dimensions": NaN}', "dimensions"),
                              ("/embed", b'{"inputs": "x", "dimensions": 1e400}', "dimensions"),
                              ("/embed", b'{"inputs": "x", "dimensions": 100000000000000000000000}', "dimensions"),
                              ("/search", b'{"query": "x", "k": -Infinity}', "k"),
                              ("/fill-mask", b'{"inputs": "a [MASK]", "model": "mlm", "top_k": 99999999999999999999}',
                               "top_k"),
                              (ATTENTION_PATH, b'{"text": "x", "layer": 99999999999999999999}', "layer")]:
        response = server.post(path, body)
        refused_cleanly(response)
        assert 400 <= response.status_code < 500 and field in response.json()["error"], (path, response.text)
    still_serving(server, "/embed")
