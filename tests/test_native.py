"""The native kernel for few tokens (``encoderkit.native``): the same states as transformers, and the PyTorch layers
wherever it does not apply.

Each family's tiny random model (tests/parity/test_families.py's configs, weights perturbed) is run through
encoderkit's engine, which takes the native path for batches of at most ``MAX_TOKENS`` tokens, and compared
sequence by sequence with transformers' model on that sequence alone (fp32, the parity tolerance 1e-5).
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from encoderkit import load_model, native
from encoderkit.engine import engine_for
from parity.test_families import CONFIGS, STEMS, TOL, VOCAB, perturb

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", autouse=True)
def kernel():
    if native.library() is None:
        pytest.skip(f"encoderkit's native kernel is not available here: {native.status()}")


def reference_and_ours(family: str, tmp_path, **overrides):
    torch.manual_seed(0)
    config = CONFIGS[family]()
    for key, value in overrides.items():
        setattr(config, key, value)
    reference = getattr(transformers, STEMS[family] + "Model")._from_config(config, attn_implementation="eager")
    reference.eval()
    perturb(reference)
    reference.save_pretrained(tmp_path)
    return config, reference, load_model(tmp_path)


def sequences(config, lengths, seed: int = 3):
    generator = np.random.default_rng(seed)
    ids = [list(generator.integers(5, VOCAB, n)) for n in lengths]
    types = None
    if getattr(config, "type_vocab_size", 0) > 1:
        types = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    return ids, types


def expected_states(reference, config, ids, types) -> list[torch.Tensor]:
    out = []
    with torch.no_grad():
        for i, row in enumerate(ids):
            inputs = {"input_ids": torch.tensor([row])}
            if types is not None:
                inputs["token_type_ids"] = torch.tensor([types[i]])
            out.append(reference(**inputs).last_hidden_state[0])
    return out


def engine_states(engine, ids, types) -> list[torch.Tensor]:
    states: list[torch.Tensor | None] = [None] * len(ids)
    for indices, hidden, packing in engine.run(ids, types):
        starts = packing.cu_seqlens.tolist()
        for k, index in enumerate(indices):
            states[index] = hidden[starts[k]:starts[k + 1]]
    return states


def assert_states(expected, actual, label: str) -> None:
    for i, (want, got) in enumerate(zip(expected, actual)):
        diff = float((want - got).abs().max())
        assert diff <= TOL, f"{label}: sequence {i} differs from transformers by {diff:.3g}"


@pytest.mark.parametrize("family", list(CONFIGS))
def test_native_states_equal_transformers(family, tmp_path):
    """One sequence, and a batch of four of different lengths (13, 9, 6 and 1 tokens), through the native kernel:
    the embeddings natively where they have no projection (BERT, RoBERTa, DistilBERT), in PyTorch before it where
    they do (ALBERT, ELECTRA), ALBERT's shared layers by its schedule, its tanh GELU, RoBERTa's positions."""
    config, reference, model = reference_and_ours(family, tmp_path)
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [13, 9, 6, 1])
    expected = expected_states(reference, config, ids, types)
    for batch in ([0], [0, 1, 2, 3]):
        got = engine_states(engine, [ids[i] for i in batch], None if types is None else [types[i] for i in batch])
        assert_states([expected[i] for i in batch], got, f"{family}, {len(batch)} sequence(s)")
    plan = native.kernel_of(model)
    assert plan is not None, "the native kernel did not run"
    assert plan.native_embeddings == (family in ("bert", "roberta", "distilbert"))


@pytest.mark.parametrize("overrides", [
    {"hidden_act": "relu"},
    {"hidden_act": "gelu_new"},
    # 36 columns: panels of 16 (AVX-512) or 8 (AVX2) leave a partial one and an odd count; head_dim 12 is not a
    # multiple of the vector width either
    {"hidden_size": 36, "num_attention_heads": 3, "intermediate_size": 50},
], ids=["relu", "gelu-tanh", "odd-sizes"])
def test_native_activations_and_sizes(overrides, tmp_path):
    config, reference, model = reference_and_ours("bert", tmp_path, **overrides)
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [17, 5, 3], seed=4)
    assert_states(expected_states(reference, config, ids, types), engine_states(engine, ids, types), str(overrides))
    assert native.kernel_of(model) is not None


@pytest.mark.parametrize("threads", [1, 2])
def test_native_thread_counts_agree(threads, tmp_path, monkeypatch):
    config, reference, model = reference_and_ours("bert", tmp_path)
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [20, 11])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = engine_states(engine, ids, types)
    finally:
        torch.set_num_threads(before)
    assert_states(expected_states(reference, config, ids, types), got, f"{threads} thread(s)")


def test_native_follows_changed_weights(tmp_path):
    """A weight changed in place after the first call (a training step, a user's edit) is packed again."""
    config, reference, model = reference_and_ours("bert", tmp_path)
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [12])
    engine_states(engine, ids, types)
    with torch.no_grad():
        model.layers[1].ffn_in.weight.mul_(1.5)
        reference.encoder.layer[1].intermediate.dense.weight.mul_(1.5)
        model.embeddings.word.weight[ids[0][0]].add_(0.25)
        reference.embeddings.word_embeddings.weight[ids[0][0]].add_(0.25)
    assert_states(expected_states(reference, config, ids, types), engine_states(engine, ids, types), "after the change")


def test_pytorch_layers_where_the_kernel_does_not_apply(tmp_path):
    """More tokens than MAX_TOKENS, int8, and a bad id: the PyTorch layers, with their results and errors."""
    config, reference, model = reference_and_ours("bert", tmp_path, max_position_embeddings=native.MAX_TOKENS + 20)
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [native.MAX_TOKENS + 10])
    assert_states(expected_states(reference, config, ids, types), engine_states(engine, ids, types), "long")
    assert native.kernel_of(model) is None  # never asked for: no batch was small enough

    bad = [[5, VOCAB + 3, 7]]
    engine_states(engine, [[5, 6, 7]], None)  # the kernel is built and used
    assert native.kernel_of(model) is not None
    with pytest.raises(IndexError) as native_error:
        engine_states(engine, bad, None)
    with torch.inference_mode():
        with pytest.raises(IndexError) as torch_error:
            model.embeddings.word(torch.tensor(bad[0]))
    assert str(native_error.value) == str(torch_error.value)

    int8_model = load_model(tmp_path)
    engine_states(engine_for(int8_model, "int8"), [[5, 6, 7]], None)
    assert native.kernel_of(int8_model) is None


def test_modern_families_are_not_eligible():
    from encoderkit.config import EncoderConfig
    from encoderkit.modeling.encoder import EncoderModel
    modern = transformers.ModernBertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
                                           pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                           sep_token_id=2)
    deberta = transformers.DebertaV2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=37, max_position_embeddings=40, relative_attention=True,
                                           pos_att_type="p2c|c2p", position_buckets=8, type_vocab_size=0)
    for config in (modern, deberta):
        model = EncoderModel(EncoderConfig.from_hf_dict(config.to_dict()))
        assert native.eligible(model) is not None, config.model_type
    bert = EncoderModel(EncoderConfig.from_hf_dict(CONFIGS["bert"]().to_dict()))
    assert native.eligible(bert) is None


def test_turned_off_by_the_environment():
    code = "from encoderkit import native; print(native.status())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ENCODERKIT_NATIVE": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "off: turned off by ENCODERKIT_NATIVE=0"
