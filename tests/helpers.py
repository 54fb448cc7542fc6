"""Small real models for unit tests, written in the HF directory format."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from encoderkit import EncoderConfig, build_model

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def tiny_bert_dir(directory: Path, tokenizer_source: Path, task: str = "base", **overrides) -> Path:
    """A 2-layer, hidden-32 BERT with the MiniLM vocabulary, saved with the MiniLM tokenizer files."""
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=128, **overrides)
    build_model(config, task).save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_source / name, directory / name)
    return directory


def perturbed_model_dir(directory: Path, tokenizer_source: Path, model_class, config) -> Path:
    """A random transformers ``model_class(config)``, its weights perturbed so that no norm or projection is at its
    near-trivial initial value, saved with the MiniLM tokenizer files."""
    torch.manual_seed(0)
    model = model_class(config)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_source / name, directory / name)
    return directory


class FakeRegistry:
    """The part of the server's model registry the web studio reads: names, the default, directories, kinds."""

    def __init__(self, models: dict[str, tuple[Path, set[str]]], index_path: Path | None = None) -> None:
        self._models = models
        self.default = next(iter(models))
        self.index_path = index_path

    def names(self) -> list[str]:
        return list(self._models)

    def path(self, name: str) -> Path:
        return self._models[name][0]

    def kinds(self, name: str) -> set[str]:
        return set(self._models[name][1])
