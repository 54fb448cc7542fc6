"""What every task pipeline shares: loading a fine-tuned directory, and running its encoder on the
packed fast path (texts tokenised once, sorted by length, no FLOP spent on padding).

A fine-tuned directory restores everything a pipeline needs: the head and labels (config.json's
``architectures`` and ``id2label``), the tokenizer files, and encoderkit's task settings (config.json's
``"encoderkit"`` section: max length, doc stride, CRF, multi-task heads).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..engine import engine_for
from ..errors import InputError
from ..modeling.models import task_settings
from ..modeling.packing import Packing
from ..tokenizer import Tokenizer

PROGRESS_MIN_SEQUENCES = 2048  # a pass over this many sequences or more shows progress (count, rate, ETA)


class TaskPipeline:
    """Base of the task pipelines: a task model, its tokenizer, and a fast (packed, optionally bf16) encoder."""

    tasks: tuple[str, ...] = ()  # the model tasks this pipeline runs

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, *, dtype: str | torch.dtype = "fp32",
                 max_length: int | None = None, token_budget: int | None = None, show_progress: bool = True,
                 device: str | torch.device | None = None) -> None:
        """``device``: "cpu", "cuda" or "cuda:N" (None: where the model is); results come back on the CPU."""
        if getattr(model, "task", None) not in self.tasks:
            raise InputError(f"{type(self).__name__} needs a model for {' or '.join(self.tasks)}, but this one is "
                             f"for {getattr(model, 'task', type(model).__name__)}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = model.config
        self.settings = task_settings(model.config)
        wanted = max_length or self.settings.get("max_length") or tokenizer.model_max_length
        self.max_length = min(int(wanted), model.config.max_sequence_length)
        self.engine = engine_for(model, dtype, "task", token_budget, at_least=self.max_length, tokenizer=tokenizer,
                                 device=device)
        self.dtype = self.engine.precision.dtype
        self.quantization = self.engine.quantization  # int8: the accuracy guard's QuantizationReport
        self.token_budget = self.engine.precision.token_budget
        self.show_progress = show_progress

    @classmethod
    def from_pretrained(cls, path: str | Path, *, allow_pickle: bool = False, **options: Any) -> "TaskPipeline":
        """``allow_pickle``: read a pytorch_model.bin (weights only) where there is no safetensors file."""
        from ..modeling.models import load_model
        from ..io.hub import resolve_model

        resolved = resolve_model(path)
        model = load_model(resolved, allow_pickle=allow_pickle)
        if model.task not in cls.tasks:
            raise InputError(f"{resolved.root} holds a {model.task} model; {cls.__name__} needs one fine-tuned for "
                             f"{' or '.join(cls.tasks)} (see `encoderkit finetune`)")
        return cls(model, Tokenizer.from_pretrained(resolved.tokenizer_dir), **options)

    def _encode(self, ids: list[list[int]], types: list[list[int]] | None
                ) -> Iterator[tuple[np.ndarray, torch.Tensor, Packing]]:
        """Packed fp32 token states of many sequences (see ``Engine.run``), outside any autocast. A long
        pass (a scan screening a whole vocabulary, a large evaluation) shows its progress."""
        shown = self.show_progress and len(ids) >= PROGRESS_MIN_SEQUENCES
        yield from self.engine.run(ids, types, progress=f"{type(self).__name__}: encoding" if shown else None)


def split_packed(values: torch.Tensor, batch: Packing) -> list[torch.Tensor]:
    """Per-sequence slices of packed per-token values."""
    return list(values.split(batch.lengths.tolist()))


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)
