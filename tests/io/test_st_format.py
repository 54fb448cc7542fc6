"""The sentence-transformers directory format: what encoderkit writes, sentence-transformers loads and embeds
with alike; what it writes, encoderkit reads back."""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from encoderkit import CheckpointError, ConfigError, Embedder, InputError, Tokenizer, load_model, resolve_model
from encoderkit.io.st_format import POOLING_MODES, pooling_mode, write_sentence_transformer

MAX_SEQ_LENGTH = 32  # below the default model's 256, so that sentence-transformers must read it to truncate alike
SENTENCES = [
    "Hi.",
    "A man is playing a guitar on stage.",
    "The stock market fell sharply after the announcement, and shares dropped as investors reacted to the news.",
    " ".join(["A long sentence that runs past the limit and is truncated at the same token by both libraries."] * 4),
]


@pytest.fixture(scope="module")
def saved_minilm(tmp_path_factory) -> Path:
    """The default model as encoderkit saves it: an HF directory without the sentence-transformers files."""
    directory = tmp_path_factory.mktemp("minilm-hf")
    model = load_model(None, task="base")
    model.save_pretrained(directory, tokenizer=Tokenizer.from_pretrained(resolve_model(None).tokenizer_dir))
    assert not (directory / "modules.json").exists()
    return directory


def _copy(saved: Path, directory: Path) -> Path:
    """A copy of the saved model whose weights are hard links (no 90 MB copy per case)."""
    shutil.copytree(saved, directory, copy_function=os.link)
    return directory


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("pooling", POOLING_MODES)
def test_sentence_transformers_loads_what_encoderkit_writes(saved_minilm, tmp_path, pooling, normalize) -> None:
    st = pytest.importorskip("sentence_transformers")
    directory = _copy(saved_minilm, tmp_path / "model")
    write_sentence_transformer(directory, pooling=pooling, normalize=normalize, max_seq_length=MAX_SEQ_LENGTH,
                               dimension=384)

    info = resolve_model(directory).sentence_transformer
    assert (info.pooling, info.normalize, info.max_seq_length, info.dimension) == (
        pooling, normalize, MAX_SEQ_LENGTH, 384)

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the version 2-5 keys load without a deprecation warning
        reference = st.SentenceTransformer(str(directory), device="cpu")
    assert reference.max_seq_length == MAX_SEQ_LENGTH and reference.similarity_fn_name == "cosine"
    assert len(reference) == (3 if normalize else 2)
    expected = reference.encode(SENTENCES, convert_to_numpy=True)
    ours = Embedder.from_pretrained(directory).encode(SENTENCES)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-5)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)


def test_round_trip_of_the_default_models_settings(saved_minilm, tmp_path) -> None:
    original = resolve_model(None).sentence_transformer
    assert original is not None and (original.pooling, original.normalize) == ("mean", True)
    directory = _copy(saved_minilm, tmp_path / "model")
    write_sentence_transformer(directory, pooling=original.pooling, normalize=original.normalize,
                               max_seq_length=original.max_seq_length, dimension=original.dimension)
    assert resolve_model(directory).sentence_transformer == original
    # Written again with other settings, the files say the new ones (no stale module from the first write).
    write_sentence_transformer(directory, pooling="cls", normalize=False, max_seq_length=64, dimension=384)
    modules = json.loads((directory / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling"]
    again = resolve_model(directory).sentence_transformer
    assert (again.pooling, again.normalize, again.max_seq_length) == ("cls", False, 64)
    config = json.loads((directory / "config_sentence_transformers.json").read_text())
    assert config["similarity_fn_name"] == "cosine" and "sentence_transformers" not in config["__version__"]


def test_pooling_config_of_every_version() -> None:
    legacy = {"word_embedding_dimension": 384, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
              "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": True}
    assert pooling_mode(legacy) == "mean_sqrt_len"
    # sentence-transformers 6 writes one string (or a list), with its own name for mean_sqrt_len
    assert pooling_mode({"embedding_dimension": 384, "pooling_mode": "mean_sqrt_len_tokens"}) == "mean_sqrt_len"
    assert pooling_mode({"pooling_mode": ["weightedmean"]}) == "weightedmean"
    with pytest.raises(ConfigError, match="exactly one mode"):
        pooling_mode({"pooling_mode": ["cls", "mean"]})
    with pytest.raises(ConfigError, match="'lasttoken' is not supported"):
        pooling_mode({"pooling_mode_lasttoken": True})


def test_writer_errors(tmp_path, saved_minilm) -> None:
    with pytest.raises(CheckpointError, match="save the model there first"):
        write_sentence_transformer(tmp_path, pooling="mean", normalize=False, max_seq_length=8, dimension=4)
    directory = _copy(saved_minilm, tmp_path / "model")
    with pytest.raises(InputError, match="unknown pooling 'lasttoken'"):
        write_sentence_transformer(directory, pooling="lasttoken", normalize=False, max_seq_length=8, dimension=4)
    with pytest.raises(InputError, match="max_seq_length must be a positive integer"):
        write_sentence_transformer(directory, pooling="mean", normalize=False, max_seq_length=0, dimension=4)


def test_sentence_transformers_directory_of_a_modernbert_loads_as_an_embedder(tmp_path, minilm_dir) -> None:
    """A sentence-transformers directory whose transformer is ModernBERT (mean pooling, normalised) embeds in
    encoderkit as in sentence-transformers."""
    transformers = pytest.importorskip("transformers")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
        global_attn_every_n_layers=3, local_attention=8, pad_token_id=0, bos_token_id=101, eos_token_id=102,
        cls_token_id=101, sep_token_id=102)
    transformers.ModernBertModel(config).save_pretrained(tmp_path)
    Tokenizer.from_pretrained(minilm_dir).save(tmp_path)
    write_sentence_transformer(tmp_path, pooling="mean", normalize=True, max_seq_length=64, dimension=32)
    texts = ["A man is playing a guitar.", "Encoders read in both directions, so every token sees the whole "
             "sentence and its neighbours beyond a local window of eight tokens.", "short"]
    embedder = Embedder.from_pretrained(tmp_path)
    assert embedder.model.config.model_type == "modernbert" and embedder.pooling == "mean" and embedder.normalize
    want = sentence_transformers.SentenceTransformer(str(tmp_path), device="cpu").encode(texts)
    assert np.abs(embedder.encode(texts) - want).max() <= 1e-5
