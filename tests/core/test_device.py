"""Choosing where a model computes (``device``): what it means for the dtype, int8 and the batch size, and a clear
error for a device this machine does not have. The CUDA path itself is compared with the CPU path by
bench/gpu.py on a machine with a GPU (BENCHMARKS.md, "On a GPU"); CI has none."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from encoderkit import Embedder, precision
from encoderkit.errors import InputError
from encoderkit.precision import GPU_BUDGET_FACTOR, TOKEN_BUDGETS, Precision, resolve_device
from encoderkit.training.finetune import Recipe

CUDA = torch.device("cuda")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_devices_are_checked_with_a_clear_error(no_gpu) -> None:
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(InputError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(InputError, match="not on 'meta'"):
        resolve_device("meta")
    with pytest.raises(InputError, match="torch sees none.*use device cpu"):
        resolve_device("cuda")
    with pytest.raises(InputError, match="torch sees none"):
        Recipe(device="cuda:0")
    assert Recipe(device="cpu").device == "cpu"


def test_a_gpu_index_beyond_the_gpus_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(InputError, match=r"sees 2 CUDA GPUs \(cuda:0 to cuda:1\)"):
        resolve_device("cuda:2")


def test_on_a_gpu_auto_follows_the_gpu_and_int8_is_refused(monkeypatch, caplog) -> None:
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)  # the host CPU must not decide
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert Precision.resolve("auto", "embed", device=CUDA).dtype == torch.bfloat16
    assert Precision.resolve("auto", "embed").dtype == torch.float32  # the same call for the CPU
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)  # before Ampere
    assert Precision.resolve("auto", "embed", device=CUDA).dtype == torch.float32
    with caplog.at_level(logging.WARNING, logger="encoderkit.precision"):
        assert Precision.resolve("bf16", "embed", device=CUDA).dtype == torch.bfloat16
    assert not [r for r in caplog.records if "emulated" in r.getMessage()]  # the CPU's warning is not the GPU's
    with pytest.raises(InputError, match="int8 runs on the CPU only"):
        Precision.resolve("int8", "embed", device=CUDA)


def test_a_gpu_batch_holds_more_tokens_unless_told(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    for purpose in ("embed", "task"):
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            assert Precision.resolve(name, purpose, device=CUDA).token_budget == \
                TOKEN_BUDGETS[purpose][dtype] * GPU_BUDGET_FACTOR
            assert Precision.resolve(name, purpose).token_budget == TOKEN_BUDGETS[purpose][dtype]
            assert Precision.resolve(name, purpose, token_budget=1000, device=CUDA).token_budget == 1000


def test_embedder_on_the_cpu_by_name_equals_the_default(minilm_dir) -> None:
    texts = ["A man is playing a guitar.", "Stocks fell sharply on Monday after the report was published."]
    default = Embedder.from_pretrained(minilm_dir).encode(texts)
    named = Embedder.from_pretrained(minilm_dir, device="cpu")
    assert next(named.model.parameters()).device.type == "cpu"
    np.testing.assert_array_equal(named.encode(texts), default)


def test_cli_names_the_missing_gpu(no_gpu, tmp_path, minilm_dir) -> None:
    from encoderkit.cli.app import cli

    source = tmp_path / "in.txt"
    source.write_text("hello world\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["embed", str(source), "--out", str(tmp_path / "out.npy"), "--device", "cuda",
                                       "--model", str(minilm_dir)])
    assert result.exit_code == 2, result.output
    assert "asked for a CUDA GPU, but torch sees none" in result.output
    assert not (tmp_path / "out.npy").exists()
    result = CliRunner().invoke(cli, ["embed", str(source), "--out", str(tmp_path / "o.npy"), "--device", "cuda",
                                       "--engine", "ray"])
    assert result.exit_code == 2 and "--device is for --engine local" in result.output
