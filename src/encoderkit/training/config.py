"""The Trainer's settings (``TrainingConfig``): one dataclass, checked when made, that a checkpoint records and a
resumed run compares against."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InputError


@dataclass
class TrainingConfig:
    output_dir: str
    max_steps: int
    batch_size: int = 32  # per process and micro-batch
    grad_accumulation: int = 1
    learning_rate: float = 5e-4
    weight_decay: float = 0.01
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-6
    warmup_ratio: float = 0.06
    warmup_steps: int | None = None  # overrides warmup_ratio
    schedule: str = "linear"  # linear | cosine | constant
    max_grad_norm: float | None = 1.0
    bf16: bool = False  # autocast the forward pass to bf16 (CPU or CUDA)
    eval_every: int = 0  # steps; 0 = only at the end
    save_every: int = 0  # steps; 0 = only at the end
    keep_last: int = 3
    log_every: int = 10
    seed: int = 0
    show_progress: bool = True
    device: str = "cpu"  # "cuda" puts the model and batches on the (local) GPU
    time_budget_s: float | None = None  # also stop (and save) once this much training time has passed
    group_by_length: bool = False  # batches of similar lengths (needs the examples' lengths): less padding
    drop_last: bool = True  # drop an epoch's last partial batch (pre-training) or keep it (fine-tuning)
    shuffle: bool = True  # False: the examples in their given order each epoch (a caller that shuffles them itself)
    metric_for_best: str | None = None  # an evaluation metric (e.g. "f1"): its best model is kept in best/
    greater_is_better: bool = True
    early_stopping_patience: int | None = None  # stop after this many evaluations without improvement
    save_final: bool = True  # write the last weights to final/ (HF format)

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "grad_accumulation"):
            if getattr(self, name) <= 0:
                raise InputError(f"{name} must be positive, found {getattr(self, name)}")
        if self.schedule not in ("linear", "cosine", "constant"):
            raise InputError(f"schedule must be linear, cosine or constant, found {self.schedule!r}")
        if self.learning_rate <= 0:
            raise InputError(f"learning_rate must be positive, found {self.learning_rate}")
        if self.early_stopping_patience is not None and (self.early_stopping_patience <= 0 or not self.metric_for_best):
            raise InputError("early stopping needs metric_for_best and a positive patience")
        self.adam_betas = tuple(self.adam_betas)  # type: ignore[assignment]

    @property
    def warmup(self) -> int:
        """Warm-up steps: ``warmup_steps``, else ``warmup_ratio`` of the run rounded up (transformers' rule)."""
        return self.warmup_steps if self.warmup_steps is not None else math.ceil(self.warmup_ratio * self.max_steps)
