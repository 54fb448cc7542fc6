"""Jobs behind the CLI that combine a model, its tokenizer and its files: model facts and the demo."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from .config import EncoderConfig
from .hub import resolve_model
from .modeling.models import hf_architecture, task_from_architectures
from .tokenizer import Tokenizer
from .zoo import count_parameters


def _weights_summary(directory: Path) -> tuple[str, str]:
    """(file names, tensor dtypes) of a checkpoint, read from the safetensors header only."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("pytorch_model*.bin"))
    dtypes: set[str] = set()
    for path in files:
        if path.suffix != ".safetensors":
            continue
        try:
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():
                    dtypes.add(str(handle.get_slice(key).get_dtype()))
        except Exception:  # reported properly when the weights are loaded
            dtypes.add("unreadable")
    size = sum(p.stat().st_size for p in files)
    return f"{', '.join(p.name for p in files) or 'none'} ({size / 2**20:.1f} MiB)", ", ".join(sorted(dtypes)) or "?"


def model_info(model: str | Path | None) -> dict[str, Any]:
    resolved = resolve_model(model)
    config = EncoderConfig.from_json_file(resolved.weights_dir / "config.json")
    task = task_from_architectures(config)
    files, dtypes = _weights_summary(resolved.weights_dir)
    facts: dict[str, Any] = {
        "path": str(resolved.root),
        "family": config.model_type,
        "architecture": hf_architecture(config, task),
        "task": task,
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "embedding_size": config.embedding_dim,
        "activation": config.hidden_act,
        "max_sequence_length": config.max_sequence_length,
        "parameters": count_parameters(config, task),
        "weights": files,
        "weight_dtypes": dtypes,
    }
    if config.num_hidden_groups:
        facts["shared_layer_groups"] = config.num_groups
    if config.id2label:
        facts["labels"] = ", ".join(config.labels)
    tokenizer = Tokenizer.from_pretrained(resolved.tokenizer_dir)
    facts.update({"tokenizer": tokenizer.kind, "tokenizer_vocab": tokenizer.vocab_size,
                  "tokenizer_max_length": tokenizer.model_max_length})
    if tokenizer.lowercase is not None:
        facts["lowercase"] = tokenizer.lowercase
    info = resolved.sentence_transformer
    if info is not None:
        facts.update({"pooling": info.pooling, "normalize": info.normalize,
                      "sentence_max_length": info.max_seq_length})
    return facts


DEMO_SENTENCES = [
    "A man is playing a guitar on stage.",
    "Someone performs music with a stringed instrument.",
    "The stock market fell sharply after the announcement.",
    "Shares dropped as investors reacted to the news.",
    "A cat sleeps on a sunny windowsill.",
    "The kitten is napping in the sunlight by the window.",
    "How do I reset my password?",
    "I forgot my login credentials and need to change them.",
]


def run_demo(model: str | Path | None, echo: Callable[[str], None] = print) -> dict[str, Any]:
    from .tasks.embed import Embedder, cosine_similarity

    facts = model_info(model)
    echo("== model ==")
    for key in ("path", "family", "architecture", "layers", "hidden_size", "attention_heads", "parameters",
                "tokenizer", "pooling", "normalize", "sentence_max_length"):
        if key in facts:
            value = f"{facts[key]:,}" if key == "parameters" else facts[key]
            echo(f"  {key:20s} {value}")
    embedder = Embedder.from_pretrained(model)
    vectors = embedder.encode(DEMO_SENTENCES)
    echo(f"\n== embeddings == {vectors.shape[0]} sentences -> {vectors.shape[1]}-dim vectors "
         f"(pooling {embedder.pooling}, normalised {embedder.normalize})")
    echo(f"  first vector, first 6 values: {np.array2string(vectors[0, :6], precision=4)}")
    similarity = cosine_similarity(vectors, vectors)
    np.fill_diagonal(similarity, -np.inf)
    echo("\n== nearest neighbours (cosine) ==")
    neighbours = []
    for index, sentence in enumerate(DEMO_SENTENCES):
        best = int(np.argmax(similarity[index]))
        neighbours.append(best)
        echo(f"  {sentence}\n      -> {DEMO_SENTENCES[best]}  ({similarity[index, best]:.3f})")
    return {"facts": facts, "neighbours": neighbours}
