"""Numeric precision: which dtype to compute in, and whether this machine has native bf16 matrix units."""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import InputError

log = logging.getLogger(__name__)

_NAMES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
DTYPE_CHOICES = ("fp32", "bf16", "auto")


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """True when the CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX-BF16)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """"fp32" / "bf16" / "auto" (bf16 only where the hardware runs it natively) -> a torch dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16):
            raise InputError(f"encoderkit computes in float32 or bfloat16, not {dtype}")
        return dtype
    name = str(dtype).lower()
    if name == "auto":
        chosen = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
        log.info("dtype auto -> %s", "bf16 (native bf16 matrix units)" if chosen == torch.bfloat16 else "fp32")
        return chosen
    if name not in _NAMES:
        raise InputError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    return _NAMES[name]


# Padded tokens per inference batch, by what the batch is for and the compute dtype: the best measured on the
# embedding bench (BENCHMARKS.md); task pipelines and scanners run heads on every token and take twice as many.
TOKEN_BUDGETS = {
    "embed": {torch.float32: 2048, torch.bfloat16: 4096},
    "task": {torch.float32: 4096, torch.bfloat16: 8192},
}


@dataclass(frozen=True)
class Precision:
    """The compute dtype of an inference job and its batch size in tokens, resolved once from the user's choice."""

    dtype: torch.dtype
    token_budget: int

    @classmethod
    def resolve(cls, dtype: str | torch.dtype = "fp32", purpose: str = "task", token_budget: int | None = None,
                at_least: int = 0) -> "Precision":
        """``dtype``: "fp32" / "bf16" / "auto" / a torch dtype; ``purpose``: a key of ``TOKEN_BUDGETS``;
        ``at_least``: the longest sequence a batch must hold (a budget below it is raised to it)."""
        if isinstance(dtype, Precision):
            return dtype
        resolved = resolve_dtype(dtype)
        budget = token_budget if token_budget is not None else TOKEN_BUDGETS[purpose][resolved]
        if budget <= 0:
            raise InputError(f"token_budget must be positive, found {budget}")
        return cls(resolved, max(budget, at_least))
