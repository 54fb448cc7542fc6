"""Commands that need an optional extra say which one at once, in one line, before loading anything."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from encoderkit.extras import EXTRAS, MissingExtraError, missing_modules, require

from test_cli import invoke


@pytest.fixture()
def without(monkeypatch):
    """Makes the named top-level modules look uninstalled to ``importlib.util.find_spec``."""
    hidden: set[str] = set()
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name.split(".")[0] in hidden else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return hidden


@pytest.fixture()
def nothing_loads(monkeypatch):
    """Fails the test if a model is loaded: the check must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the extra was checked")

    monkeypatch.setattr("encoderkit.server.ModelRegistry.load", refuse)
    monkeypatch.setattr("encoderkit.export.export_model", refuse)
    monkeypatch.setattr("encoderkit.jobs.build_index_job", refuse)


def one_error_line(result, extra: str, module: str) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    line = lines[0]
    assert line.startswith("encoderkit: error: ")
    assert f"'{extra}' extra" in line and f"pip install 'encoderkit[{extra}]'" in line and module in line
    assert "Traceback" not in result.output
    return line


def test_serve_without_its_extra_is_one_clear_line(without, nothing_loads) -> None:
    without.add("uvicorn")
    line = one_error_line(invoke("serve", "default"), "serve", "uvicorn")
    assert "fastapi" not in line.split("missing:")[1]  # only what is missing is named


def test_export_onnx_without_its_extra(without, nothing_loads, tmp_path) -> None:
    without.update({"onnx", "onnxruntime"})
    one_error_line(invoke("export", "default", "--out", tmp_path / "onnx"), "onnx", "onnxruntime")


def test_embed_with_ray_without_its_extra(without, tmp_path, monkeypatch) -> None:
    without.add("ray")
    monkeypatch.setattr("encoderkit.Embedder.from_pretrained",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("model loaded first")))
    texts = tmp_path / "texts.txt"
    texts.write_text("one\ntwo\n", encoding="utf-8")
    one_error_line(invoke("embed", texts, "--out", tmp_path / "shards", "--engine", "ray"), "ray", "ray")


def test_faiss_index_kinds_without_their_extra(without, nothing_loads, tmp_path) -> None:
    without.add("faiss")
    vectors = tmp_path / "v.npy"
    np.save(vectors, np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    one_error_line(invoke("index", vectors, "--out", tmp_path / "index", "--kind", "hnsw"), "ann", "faiss")


def test_installed_extras_pass_and_every_extra_is_in_pyproject() -> None:
    import tomllib
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert set(EXTRAS) <= set(declared)
    for extra in EXTRAS:  # the test install has every extra
        assert missing_modules(extra) == [], extra
        require(extra, "a command")
    assert issubclass(MissingExtraError, Exception)
