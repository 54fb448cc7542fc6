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
