"""Tiny inputs for the training and evaluation benchmarks' smoke runs (``python -m bench run NAME --smoke``).

A smoke run (``common.SMOKE``) checks that a benchmark still runs end to end, never how fast or how well: a script
keeps its code path and shrinks what it reads. The helpers here shrink what several scripts read: the head of a
text file, a few CoNLL sentences, a few SQuAD questions, a tiny random BERT to fine-tune in place of the default model,
and the shared SST-2 classifier, fine-tuned on a few rows.
Outside a smoke run each hands back its input unchanged (or the real classifier), so a script calls them whatever
the mode. A smoke run's models are cached in folders of their own (``cache_dir``), so that a full run never finds
a smoke run's tiny model in its cache and takes it for its own.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import common


def cache_dir(name: str) -> Path:
    """``common.CACHE / name``, or ``name-smoke`` beside it in a smoke run."""
    return common.CACHE / (f"{name}-smoke" if common.SMOKE else name)


def skip(part: str, reason: str) -> dict[str, str]:
    """Say that a part of a smoke run is skipped and why; the record a result keeps of it."""
    print(f"smoke: skipping {part}: {reason}", flush=True)
    return {"part": part, "reason": reason}


def missing(*modules: str) -> str | None:
    """Why a part that imports ``modules`` cannot run here (the first one not installed), or None."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return f"the Python package {module!r} is not installed"
    return None


def head(path: Path, work: Path, lines: int) -> Path:
    """``path`` itself, or in a smoke run a copy of its first ``lines`` lines under ``work``."""
    if not common.SMOKE:
        return path
    out = work / f"smoke-{path.name}"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()[:lines]
    out.write_text("\n".join(text) + "\n", encoding="utf-8")
    return out


def _conll_blocks(path: Path) -> list[str]:
    blocks = path.read_text(encoding="utf-8").split("\n\n")
    return [b.strip("\n") for b in blocks if b.strip() and not b.strip().startswith("-DOCSTART-")]


def conll_pair(train: Path, valid: Path, work: Path, sentences: int = 48) -> tuple[Path, Path]:
    """(train, valid) themselves, or in a smoke run the first ``sentences`` training sentences and a quarter as
    many validation sentences whose tags (IOB2, as the reader makes them) all occur in those training sentences:
    a tag the training part never saw is a data error."""
    if not common.SMOKE:
        return train, valid
    from encoderkit.data.tasks import iob1_to_iob2

    def tags(block: str) -> set[str]:
        return set(iob1_to_iob2([line.split()[-1] for line in block.splitlines() if line.strip()]))

    kept = _conll_blocks(train)[:sentences]
    known = set().union(*map(tags, kept))
    checked = [b for b in _conll_blocks(valid) if tags(b) <= known][:max(2, sentences // 4)]
    work.mkdir(parents=True, exist_ok=True)
    paths = work / "smoke-train.conll", work / "smoke-valid.conll"
    for path, blocks in zip(paths, (kept, checked)):
        path.write_text("-DOCSTART- -X- -X- O\n\n" + "\n\n".join(blocks) + "\n", encoding="utf-8")
    return paths


def squad_data(data: dict[str, Any], paragraphs: int = 1, questions: int = 2) -> dict[str, Any]:
    """SQuAD JSON as it is, or in a smoke run every article cut to its first ``paragraphs`` paragraphs of
    ``questions`` questions each (the articles stay: splits by article keep their shape)."""
    if not common.SMOKE:
        return data
    articles = [{**article, "paragraphs": [{**p, "qas": p["qas"][:questions]}
                                           for p in article["paragraphs"][:paragraphs]]}
                for article in data["data"]]
    return {**data, "data": articles}


def squad_file(path: Path, work: Path) -> Path:
    """``path`` itself, or in a smoke run a copy cut by ``squad_data`` under ``work``."""
    if not common.SMOKE:
        return path
    out = work / f"smoke-{path.name}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(squad_data(json.loads(path.read_text(encoding="utf-8")))), encoding="utf-8")
    return out


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def tiny_model() -> Path | None:
    """None (the default model) outside a smoke run; in one, a random BERT of 2 layers, hidden 32 and 512
    positions with the default model's vocabulary and tokenizer files, built once in ``cache_dir("tiny-bert")``:
    a fine-tuning step of it costs next to nothing, where one of all-MiniLM-L6-v2 takes seconds on a busy CPU."""
    if not common.SMOKE:
        return None
    out = cache_dir("tiny-bert")
    if (out / "model.safetensors").is_file():
        return out
    import torch
    import transformers

    from encoderkit import default_model_path

    out.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="tiny-bert-", dir=out.parent))
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=512)
    transformers.BertModel(config).save_pretrained(building)
    for name in TOKENIZER_FILES:
        shutil.copy(default_model_path() / name, building / name)
    try:
        os.replace(building, out)  # whole or not at all: a process beside it may be building it too
    except OSError:
        shutil.rmtree(building, ignore_errors=True)
    return out


def sst2_classifier() -> Path:
    """``common.sst2_classifier()``, or in a smoke run all-MiniLM-L6-v2 fine-tuned for two epochs on 256 SST-2 rows
    (max length 32, lr 1e-4), cached in its own folder."""
    if not common.SMOKE:
        return common.sst2_classifier()
    from encoderkit.training.finetune import Recipe, finetune

    out = cache_dir("sst2-classifier")
    if (out / "model.safetensors").is_file() and (out / "eval_results.json").is_file():
        return out
    # The default model, not the tiny random one: the tiny one learns to answer one class whatever the text, and
    # then no attack flips a prediction (bench/shift.py needs some that do).
    train = common.write_tsv(out.parent / "sst2-smoke-rows.tsv", common.sst2_rows()[:256])
    finetune("classify", train, out, recipe=Recipe(epochs=2, batch_size=16, learning_rate=1e-4, max_length=32,
                                                   show_progress=False))
    return out
