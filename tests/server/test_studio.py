"""The web studio's own routes (no browser): the page, its static files, /studio/models and /studio/attention,
whose maps and statistics must be AttentionAnalyzer's."""
from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from encoderkit.analysis import AttentionAnalyzer  # noqa: E402
from encoderkit.server import studio as studio_module  # noqa: E402
from encoderkit.server.studio import MAX_TEXT_CHARS, mount_studio  # noqa: E402
from helpers import FakeRegistry, tiny_bert_dir  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("studio-models")
    return {"tiny": tiny_bert_dir(root / "tiny", minilm_dir),
            "tiny-mlm": tiny_bert_dir(root / "tiny-mlm", minilm_dir, task="masked-lm")}


@pytest.fixture(scope="module")
def client(models):
    app = FastAPI()
    registry = FakeRegistry({"tiny": (models["tiny"], {"embed"}), "tiny-mlm": (models["tiny-mlm"], {"fill-mask"})})
    mount_studio(app, registry)
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def analyzer(models):
    return AttentionAnalyzer.from_pretrained(models["tiny"])


def attention(client, **body):
    return client.post("/studio/attention", json=body)


def test_page_and_static_files_are_local(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert "/studio/static/studio.js" in sources and "/studio/static/studio.css" in sources
    assert all(s.startswith(("/studio/static/", "data:")) for s in sources), sources
    for name, kind in [("studio.js", "javascript"), ("studio.css", "css")]:
        answer = client.get(f"/studio/static/{name}")
        assert answer.status_code == 200 and kind in answer.headers["content-type"]
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", answer.text), f"{name} names another origin"


def test_models_lists_the_registry(client):
    answer = client.get("/studio/models").json()
    assert answer["default"] == "tiny" and answer["search"] is False
    by_name = {m["name"]: m for m in answer["models"]}
    assert by_name["tiny"] == {"name": "tiny", "family": "bert", "layers": 2, "heads": 4, "kinds": ["embed"],
                               "mask_token": "[MASK]"}
    assert by_name["tiny-mlm"]["kinds"] == ["fill-mask"]
    assert answer["limits"]["max_chars"] == MAX_TEXT_CHARS


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 3)])
def test_attention_is_the_analyzers(client, analyzer, layer, head):
    answer = attention(client, text=TEXT, layer=layer, head=head)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    both = analyzer.attend(TEXT)
    causal = analyzer.attend(TEXT, mask="causal")
    assert data["tokens"] == both.tokens and (data["layers"], data["heads"]) == (2, 4)
    assert data["special"] == both.special_positions and data["model"] == "tiny"
    np.testing.assert_allclose(data["bidirectional"], both.head(layer, head), atol=1e-6)
    np.testing.assert_allclose(data["causal"], causal.head(layer, head), atol=1e-6)
    # The causal map is the model re-run with the mask (compare_masks' map), not the bidirectional one cut.
    comparison = analyzer.compare_masks(TEXT, layer=layer, head=head)
    np.testing.assert_allclose(data["causal"], comparison.causal, atol=1e-6)
    assert np.triu(np.array(data["causal"]), 1).max() == 0
    for mask, maps in [("bidirectional", both), ("causal", causal)]:
        stats = maps.statistics()
        shown = data["statistics"][mask]
        for category in stats.categories:
            assert shown[category] == pytest.approx(float(stats.shares[category][layer, head]), abs=1e-9)
        assert shown["entropy"] == pytest.approx(float(stats.entropy[layer, head]), abs=1e-9)
        assert sum(shown[c] for c in stats.categories) == pytest.approx(1.0, abs=1e-6)
    assert data["statistics"]["uniform_entropy"] == pytest.approx(np.log(len(both.tokens)))


def test_pair_and_model_choice(client, models):
    answer = attention(client, text="Where is the cat?", pair="On the mat.", model="tiny-mlm", layer=1, head=2)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    maps = AttentionAnalyzer.from_pretrained(models["tiny-mlm"]).attend("Where is the cat?", "On the mat.")
    assert data["model"] == "tiny-mlm" and data["tokens"] == maps.tokens
    assert data["segments"] == maps.sequence_ids and data["tokens"].count("[SEP]") == 2
    np.testing.assert_allclose(data["bidirectional"], maps.head(1, 2), atol=1e-6)


@pytest.mark.parametrize("body,status,message", [
    ({"text": ""}, 422, "text: the text is empty"),
    ({"text": "   \n"}, 422, "text: the text is empty"),
    ({}, 422, "text: this field is required"),
    ({"text": 12}, 422, "text: Input should be a valid string"),
    ({"text": "hi", "pair": 3}, 422, "pair: Input should be a valid string"),
    ({"text": "hi", "layer": 2}, 422, "layer must be between 0 and 1 (the model has 2 layers"),
    ({"text": "hi", "layer": -1}, 422, "layer must be between 0 and 1"),
    ({"text": "hi", "head": 4}, 422, "head must be between 0 and 3 (each layer has 4 heads"),
    ({"text": "hi", "head": "1"}, 422, "head: Input should be a valid integer"),
    ({"text": "hi", "layer": True}, 422, "layer: Input should be a valid integer"),
    ({"text": "hi", "model": "gpt"}, 422, "model: unknown model 'gpt'; this server has 'tiny', 'tiny-mlm'"),
    ({"text": "x" * (MAX_TEXT_CHARS + 1)}, 413, f"the studio takes at most {MAX_TEXT_CHARS}"),
    ({"text": "hi", "pair": "x" * (MAX_TEXT_CHARS + 1)}, 413, f"pair: {MAX_TEXT_CHARS + 1} characters"),
    ({"text": "word " * 200}, 413, "the attention explorer shows at most 128 tokens"),
])
def test_bad_requests_are_refused_and_the_next_succeeds(client, body, status, message):
    answer = attention(client, **body)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"] and answer.json()["error_type"] == "Validation"
    assert attention(client, text="still serving", layer=1, head=1).status_code == 200


def test_bodies_that_are_not_an_object(client):
    answer = client.post("/studio/attention", content=b"{not json", headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]
    answer = client.post("/studio/attention", content=b"")
    assert answer.status_code == 400 and "fields: text, pair, model, layer, head" in answer.json()["error"]
    answer = client.post("/studio/attention", json=["a list"])
    assert answer.status_code == 422 and "body: Input should be an object" in answer.json()["error"]


def test_models_load_once_and_layers_reuse_the_maps(models, monkeypatch):
    loads, runs = [], []
    real_load, real_attend = AttentionAnalyzer.from_pretrained, AttentionAnalyzer.attend

    def load(path, **kwargs):
        loads.append(path)
        return real_load(path, **kwargs)

    def attend(self, text, pair=None, *, mask="bidirectional"):
        runs.append(mask)
        return real_attend(self, text, pair, mask=mask)

    monkeypatch.setattr(AttentionAnalyzer, "from_pretrained", staticmethod(load))
    monkeypatch.setattr(AttentionAnalyzer, "attend", attend)
    app = FastAPI()
    mount_studio(app, FakeRegistry({"tiny": (models["tiny"], {"embed"})}))
    with TestClient(app) as client:
        assert loads == []  # nothing loads before the first request
        for layer, head in [(0, 0), (1, 2), (0, 3)]:
            assert attention(client, text=TEXT, layer=layer, head=head).status_code == 200
        assert len(loads) == 1 and runs == ["bidirectional", "causal"]  # one run per mask, then the cache
        for index in range(studio_module.CACHED_INPUTS + 1):
            assert attention(client, text=f"text number {index}").status_code == 200
        assert attention(client, text=TEXT).status_code == 200  # pushed out of the cache: run again
        assert len(runs) == 2 * (studio_module.CACHED_INPUTS + 3)


def test_the_server_mounts_the_studio_behind_its_key(models):
    from encoderkit.server import ModelRegistry, ServerSettings
    from encoderkit.server.app import create_app

    registry = ModelRegistry.load([("tiny", models["tiny"])])
    with TestClient(create_app(registry, ServerSettings(api_key="k3y"))) as client:
        refused = attention(client, text=TEXT)
        assert refused.status_code == 401 and "API key" in refused.json()["error"]
        answer = client.post("/studio/attention", json={"text": TEXT, "layer": 1, "head": 2},
                             headers={"Authorization": "Bearer k3y"})
        assert answer.status_code == 200 and answer.json()["model"] == "tiny"
        models_answer = client.get("/studio/models", headers={"Authorization": "Bearer k3y"}).json()
        assert models_answer["models"][0]["kinds"] == ["embed", "embed_all"]
