"""Checkpoint tensor names from other writers: LayerNorm ``gamma``/``beta`` (TensorFlow-era BERT checkpoints, and
PyLate's through transformers 5.0-5.3) load as transformers loads them."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from encoderkit import load_model

transformers = pytest.importorskip("transformers")


def test_layernorm_gamma_and_beta_load_as_weight_and_bias(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37)
    reference = transformers.BertModel(config).eval()
    for parameter in reference.parameters():
        parameter.data += 0.1 * torch.randn_like(parameter)
    reference.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in state.items()}
    assert sum(k.endswith(".gamma") for k in renamed) == 2 * config.num_hidden_layers + 1
    save_file(renamed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids = torch.randint(5, 99, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        theirs = transformers.BertModel.from_pretrained(tmp_path).eval()(input_ids=ids, attention_mask=mask)
        ours = load_model(tmp_path)(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(ours.last_hidden_state[real], theirs.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.last_hidden_state[real], reference(input_ids=ids, attention_mask=mask)
                               .last_hidden_state[real], atol=1e-5, rtol=0)
