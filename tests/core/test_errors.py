"""Bad input gets the right EncoderkitError, naming the problem; the CLI prints one line and exits 2."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from encoderkit import CheckpointError, ConfigError, Tokenizer, TokenizerError, load_model
from encoderkit.cli import main

from helpers import tiny_bert_dir


@pytest.fixture()
def model_dir(tmp_path: Path, minilm_dir: Path) -> Path:
    return tiny_bert_dir(tmp_path / "tiny", minilm_dir)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("encoderkit")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "encoderkit.cli"]
    return subprocess.run(command + list(args), capture_output=True, text=True, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("encoderkit: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def test_missing_model_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="model not found"):
        load_model(tmp_path / "nope")
    assert_one_line_error(run_cli("info", str(tmp_path / "nope")), "model not found", "nope")


def test_corrupted_safetensors(model_dir: Path) -> None:
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_model(model_dir)
    garbage = model_dir / "model.safetensors"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="corrupted"):
        load_model(model_dir)
    assert_one_line_error(run_cli("embed", "--model", str(model_dir), __file__, "--out",
                                  str(model_dir / "out.npy")), "safetensors")


def test_unknown_model_type(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    config["model_type"] = "llama"
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="unknown model_type 'llama'"):
        load_model(model_dir)
    assert_one_line_error(run_cli("info", str(model_dir)), "llama")


def test_wrong_shape_is_named(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    config["intermediate_size"] = 48
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as caught:
        load_model(model_dir)
    message = str(caught.value)
    assert "wrong shape" in message
    assert "encoder.layer.0.intermediate.dense.weight: checkpoint (64, 32) vs model (48, 32)" in message
    assert_one_line_error(run_cli("embed", "--model", str(model_dir), __file__, "--out",
                                  str(model_dir / "out.npy")), "wrong shape")


def test_missing_and_unexpected_tensors_are_listed(model_dir: Path) -> None:
    state = load_file(str(model_dir / "model.safetensors"))
    del state["encoder.layer.1.attention.self.key.weight"]
    state["encoder.layer.2.output.dense.weight"] = torch.zeros(32, 64)
    save_file(state, str(model_dir / "model.safetensors"))
    with pytest.raises(CheckpointError) as caught:
        load_model(model_dir)
    message = str(caught.value)
    assert "missing tensors [encoder.layer.1.attention.self.key.weight]" in message
    assert "unexpected tensors [encoder.layer.2.output.dense.weight]" in message


def test_pickle_needs_explicit_opt_in(model_dir: Path) -> None:
    state = load_file(str(model_dir / "model.safetensors"))
    torch.save(state, model_dir / "pytorch_model.bin")
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="allow_pickle=True"):
        load_model(model_dir)
    loaded = load_model(model_dir, allow_pickle=True)  # weights_only=True underneath
    assert torch.equal(loaded.embeddings.word.weight, state["embeddings.word_embeddings.weight"])
    assert_one_line_error(run_cli("embed", "--model", str(model_dir), __file__, "--out",
                                  str(model_dir / "out.npy")), "allow_pickle")


def test_pickle_with_code_is_refused_even_with_opt_in(model_dir: Path) -> None:
    (model_dir / "model.safetensors").unlink()
    torch.save({"weights": load_file}, model_dir / "pytorch_model.bin")  # pickles a function reference
    with pytest.raises(CheckpointError, match="weights_only=True"):
        load_model(model_dir, allow_pickle=True)


def test_missing_tokenizer_files(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no tokenizer files"):
        Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.from_pretrained(tmp_path / "nope")


def test_embed_input_errors(tmp_path: Path, model_dir: Path) -> None:
    assert_one_line_error(run_cli("embed", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "x.npy")),
                          "input file not found")
    text = tmp_path / "in.txt"
    text.write_text("hello\n")
    assert_one_line_error(run_cli("embed", str(text), "--out", str(tmp_path / "x.txt"), "--model", str(model_dir)),
                          ".npy")


def test_usage_errors_exit_2(capsys) -> None:
    assert main(["models", "--task", "poetry", "--recommend"]) == 2
    assert main(["no-such-command"]) == 2
