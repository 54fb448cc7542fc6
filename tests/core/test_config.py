from __future__ import annotations

import pytest
import torch

from encoderkit import PRESETS, ConfigError, EncoderConfig, preset
from encoderkit.zoo import count_parameters, recommend

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_count_equals_transformers(name: str) -> None:
    """Counted from our config on the meta device == transformers' model built from the same config.json."""
    config = preset(name)
    hf_config = transformers.AutoConfig.for_model(**config.to_hf_dict())
    with torch.device("meta"):
        reference = transformers.AutoModel.from_config(hf_config)
    assert count_parameters(config) == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize(("name", "published_millions", "tolerance"), [
    ("bert-base", 110, 0.01), ("bert-large", 340, 0.02), ("distilbert-base", 66, 0.01), ("albert-base", 12, 0.03),
    ("albert-large", 18, 0.03), ("albert-xxlarge", 235, 0.06), ("roberta-base", 125, 0.01),
    ("roberta-large", 355, 0.01), ("electra-small", 14, 0.04), ("electra-base", 110, 0.02),
    ("electra-large", 335, 0.01),
])
def test_preset_sizes_match_the_papers(name: str, published_millions: float, tolerance: float) -> None:
    millions = count_parameters(preset(name)) / 1e6
    assert abs(millions - published_millions) / published_millions <= tolerance, millions


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "albert", "electra"])
def test_hf_config_round_trip(family: str) -> None:
    hf = transformers.AutoConfig.for_model(family, vocab_size=123, num_labels=3)
    ours = EncoderConfig.from_hf_dict(hf.to_dict())
    back = transformers.AutoConfig.for_model(**ours.to_hf_dict())
    keys = ["vocab_size", "max_position_embeddings", "pad_token_id", "id2label"]
    keys += ["dim", "n_layers", "n_heads", "hidden_dim"] if family == "distilbert" else [
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"]
    for key in keys:
        assert getattr(back, key) == getattr(hf, key), key
    if family != "distilbert":
        assert back.layer_norm_eps == hf.layer_norm_eps and back.type_vocab_size == hf.type_vocab_size
    if family in ("albert", "electra"):
        assert back.embedding_size == hf.embedding_size
    assert ours.num_labels == 3


def test_family_defaults_fill_missing_keys() -> None:
    # An ELECTRA config.json that omits embedding_size gets transformers' default (128), not hidden_size.
    config = EncoderConfig.from_hf_dict({"model_type": "electra", "hidden_size": 256})
    assert config.embedding_dim == 128 and config.projects_embeddings
    distil = EncoderConfig.from_hf_dict({"model_type": "distilbert", "dim": 64, "n_heads": 4, "n_layers": 2,
                                         "hidden_dim": 100})
    assert (distil.hidden_size, distil.num_attention_heads, distil.intermediate_size) == (64, 4, 100)
    assert distil.type_vocab_size == 0


@pytest.mark.parametrize(("data", "message"), [
    ({"model_type": "gpt2"}, "unknown model_type 'gpt2'"),
    ({"hidden_size": 32}, "no 'model_type'"),
    ({"model_type": "bert", "hidden_size": 30, "num_attention_heads": 4}, "divisible"),
    ({"model_type": "bert", "is_decoder": True}, "decoder"),
    ({"model_type": "bert", "hidden_act": "mish"}, "unsupported activation"),
    ({"model_type": "bert", "position_embedding_type": "relative_key"}, "relative_key"),
    ({"model_type": "bert", "num_hidden_layers": 0}, "positive integer"),
])
def test_invalid_configs_are_rejected_clearly(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EncoderConfig.from_hf_dict(data)


def test_unknown_keys_survive_a_round_trip() -> None:
    data = {"model_type": "bert", "hidden_size": 64, "num_attention_heads": 4, "my_setting": [1, 2]}
    assert EncoderConfig.from_hf_dict(data).to_hf_dict()["my_setting"] == [1, 2]


def test_recommendations_name_presets_with_reasons() -> None:
    for task in ("classification", "ner", "qa", "embedding", "pretraining"):
        for constraint in ("latency", "memory", "quality", "budget"):
            choice = recommend(task, constraint)
            assert choice.preset in PRESETS and len(choice.reason) > 40
    assert recommend("classification", "memory").preset.startswith("albert")
    assert recommend("pretraining", "budget").preset.startswith("electra")
    assert count_parameters(preset(recommend("classification", "latency").preset)) < count_parameters(
        preset("bert-base"))
