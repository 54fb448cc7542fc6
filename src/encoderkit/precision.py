"""Numeric precision: which dtype to compute in, and whether this machine has native bf16 matrix units."""
from __future__ import annotations

import functools
import logging
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
