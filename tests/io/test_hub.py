"""Models named by hub id (ORG/NAME[@REVISION]): resolved from a Hugging Face cache laid out on disk here, with
revisions, offline misses and the download path faked; no test reaches the network."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from encoderkit import Embedder
from encoderkit.cli import cli
from encoderkit.errors import CheckpointError
from encoderkit.io.hub import resolve_model
from helpers import tiny_bert_dir

A, B = "a" * 40, "b" * 40


@pytest.fixture
def cache(tmp_path, minilm_dir, monkeypatch):
    """models--org--tiny with two snapshots: main -> A, tag v2 -> B (other weights)."""
    root = tmp_path / "hub"
    folder = root / "models--org--tiny"
    tiny_bert_dir(folder / "snapshots" / A, minilm_dir)
    tiny_bert_dir(folder / "snapshots" / B, minilm_dir, initializer_range=0.5)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(A)
    (folder / "refs" / "v2").write_text(B + "\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return folder


def test_a_hub_id_resolves_from_the_cache(cache):
    assert resolve_model("org/tiny").weights_dir == cache / "snapshots" / A
    assert resolve_model("org/tiny@v2").weights_dir == cache / "snapshots" / B
    assert resolve_model(f"org/tiny@{B}").weights_dir == cache / "snapshots" / B
    vectors = Embedder.from_pretrained("org/tiny").encode(["a hub model"])
    direct = Embedder.from_pretrained(cache / "snapshots" / A).encode(["a hub model"])
    np.testing.assert_array_equal(vectors, direct)


@pytest.mark.parametrize("load", ["embedder", "pipeline"])
def test_a_model_argument_is_resolved_once(cache, monkeypatch, load):
    """A pipeline resolves its model argument once and hands the result to ``load_model``, which takes it as it is
    (it resolved the snapshot's directory a second time before: the ST files read twice, and a second place for
    the two to disagree)."""
    from encoderkit import load_pipeline
    from encoderkit.io import hub

    reads = []
    original = hub.hub_id
    monkeypatch.setattr(hub, "hub_id", lambda path: reads.append(str(path)) or original(path))
    if load == "embedder":
        Embedder.from_pretrained("org/tiny")
    else:
        from encoderkit.errors import InputError

        with pytest.raises(InputError, match="not a fine-tuned"):  # loaded, then refused: an encoder, not a task
            load_pipeline("org/tiny")
    assert reads == ["org/tiny"]


def test_hf_home_is_read_when_hf_hub_cache_is_not_set(cache, monkeypatch, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(cache.parent, home / "hub")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(home))
    assert resolve_model("org/tiny").weights_dir == home / "hub" / "models--org--tiny" / "snapshots" / A


def test_cli_revision_picks_the_snapshot(cache, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("one text\nanother one\n")
    runner = CliRunner()
    for args, snapshot in ((["--model", "org/tiny", "--revision", "v2"], B), (["--model", "org/tiny"], A)):
        out = tmp_path / f"{snapshot[:2]}.npy"
        result = runner.invoke(cli, ["embed", str(texts), "--out", str(out), *args])
        assert result.exit_code == 0, result.output
        want = Embedder.from_pretrained(cache / "snapshots" / snapshot).encode(["one text", "another one"])
        np.testing.assert_allclose(np.load(out), want, atol=1e-6)
    bad = runner.invoke(cli, ["embed", str(texts), "--out", str(tmp_path / "x.npy"), "--revision", "v2"])
    assert bad.exit_code == 2 and "--revision picks a revision of a hub model" in bad.output


def test_an_offline_miss_is_one_error_naming_where_it_looked(cache, tmp_path):
    with pytest.raises(CheckpointError, match=r"'org/other'.*models--org--other.*HF_HUB_OFFLINE"):
        resolve_model("org/other")
    with pytest.raises(CheckpointError, match=r"refs/nope \(no such branch or tag there\)"):
        resolve_model("org/tiny@nope")
    texts = tmp_path / "texts.txt"
    texts.write_text("x\n")
    result = CliRunner().invoke(cli, ["embed", str(texts), "--out", str(tmp_path / "o.npy"), "--model", "org/other"])
    assert result.exit_code == 2
    assert [line for line in result.output.splitlines() if line.startswith("encoderkit: error:")] and \
        "Traceback" not in result.output


def test_online_a_miss_downloads_into_the_cache(cache, monkeypatch):
    import huggingface_hub

    asked = []

    def fake_download(repo, revision=None, cache_dir=None):
        asked.append((repo, revision, cache_dir))
        return str(cache / "snapshots" / B)

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve_model("org/elsewhere@v9").weights_dir == cache / "snapshots" / B
    assert asked == [("org/elsewhere", "v9", str(cache.parent))]

    def failing(repo, revision=None, cache_dir=None):
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
    with pytest.raises(CheckpointError, match="downloading it failed: OSError: network is unreachable"):
        resolve_model("org/elsewhere")


def test_a_missing_local_path_is_not_taken_for_a_hub_id(tmp_path):
    with pytest.raises(CheckpointError, match="model not found"):
        resolve_model("no-such-model-dir")
    with pytest.raises(CheckpointError, match="model not found"):
        resolve_model(str(tmp_path / "absent"))


def test_a_hub_model_is_served_under_its_id(cache):
    from encoderkit.server.registry import load_served_model

    served = load_served_model("org/tiny@v2")
    assert served.name == "org/tiny" and served.aliases == ("org/tiny@v2",)
    assert served.path == cache / "snapshots" / B
