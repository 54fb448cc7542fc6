"""The model zoo: parameter counts computed from the preset configs, and family recommendations."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import PRESETS, EncoderConfig, preset
from .errors import InputError


def count_parameters(config: EncoderConfig, task: str = "base") -> int:
    """Distinct parameters of the model a config describes, counted on the meta device (no memory used)."""
    from .modeling.models import build_model

    with torch.device("meta"):
        model = build_model(config, task)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@dataclass(frozen=True)
class ZooEntry:
    name: str
    config: EncoderConfig
    parameters: int


def zoo() -> list[ZooEntry]:
    return [ZooEntry(name, preset(name), count_parameters(preset(name))) for name in PRESETS]


TASKS = ("classification", "ner", "qa", "embedding", "pretraining")
CONSTRAINTS = ("latency", "memory", "quality", "budget")


@dataclass(frozen=True)
class Recommendation:
    preset: str
    reason: str


# Reasons cite the published results behind each choice.
_DISTIL = ("distilbert-base", "6 layers instead of 12: the DistilBERT paper reports 40% fewer parameters and 60% "
                              "faster inference than BERT-base while keeping 97% of its GLUE score")
_MINILM = ("minilm-l6-h384", "6 layers of hidden size 384 (~22M parameters, ~4x less compute per token than BERT-base); "
                             "the default model all-MiniLM-L6-v2 is this shape, trained for sentence embeddings")
_ALBERT = ("albert-base", "cross-layer parameter sharing and factorised embeddings give ~12M parameters for a "
                          "BERT-base-sized network (1/9 of the weights); note its compute per token is BERT-base's")
_ELECTRA_SMALL = ("electra-small", "replaced-token detection learns from every input token, not the 15% that are "
                                   "masked: the ELECTRA paper's small model, trained on one GPU in 4 days, beats GPT "
                                   "on GLUE; the cheapest family to pre-train well")
_ROBERTA_LARGE = ("roberta-large", "BERT-large's shape trained longer on more data with dynamic masking and no NSP; "
                                   "the RoBERTa paper reports it above BERT-large on GLUE, SQuAD and RACE")
_ELECTRA_LARGE = ("electra-large", "the ELECTRA paper reports it matching RoBERTa-large on GLUE with about 1/4 of the "
                                   "pre-training compute, and the best SQuAD 2.0 results of the compared models")

_TABLE: dict[tuple[str, str], tuple[str, str]] = {}
for _task in TASKS:
    _TABLE[(_task, "latency")] = _DISTIL
    _TABLE[(_task, "memory")] = _ALBERT
    _TABLE[(_task, "quality")] = _ROBERTA_LARGE
    _TABLE[(_task, "budget")] = _ELECTRA_SMALL
_TABLE[("embedding", "latency")] = _MINILM
_TABLE[("embedding", "memory")] = _MINILM
_TABLE[("embedding", "quality")] = ("bert-base", "a 12-layer BERT-base encoder fine-tuned with a contrastive "
                                                 "sentence objective; start from the default MiniLM model if "
                                                 "latency matters as much")
_TABLE[("qa", "quality")] = _ELECTRA_LARGE
_TABLE[("pretraining", "quality")] = _ELECTRA_LARGE
_TABLE[("ner", "latency")] = _DISTIL


def recommend(task: str, constraint: str) -> Recommendation:
    if task not in TASKS:
        raise InputError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
    if constraint not in CONSTRAINTS:
        raise InputError(f"unknown constraint {constraint!r}; choose one of: {', '.join(CONSTRAINTS)}")
    name, reason = _TABLE[(task, constraint)]
    return Recommendation(name, reason)
