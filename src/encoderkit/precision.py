"""Numeric precision: which dtype to compute in (or int8 linear layers, for inference only), and which matrix
instructions this machine has (native bf16, 8-bit dot products)."""
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
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of /proc/cpuinfo (empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def cpu_vendor() -> str:
    """The CPU's vendor id from /proc/cpuinfo ("GenuineIntel", "AuthenticAMD", ...; "" where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return ""


def cpu_has_native_bf16() -> bool:
    """True when the CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX-BF16)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


# int8 weight codes: 8-bit where a kernel sums u8 x s8 products exactly in 32 bits (VNNI), 7-bit where it adds pairs
# of them into 16 bits first (AVX2's vpmaddubsw, AVX-512 without VNNI): 2 x 255 x 63 = 32130 fits in 16 bits, while
# 2 x 255 x 127 = 64770 saturates at 32767 (modeling.inference.int8_weight_levels, native.int8_weight_limit).
EXACT_WEIGHT_LEVELS = 127
PAIR_SUM_WEIGHT_LEVELS = 63


def cpu_has_vnni() -> bool:
    """True when the CPU has 8-bit dot-product instructions (AVX512-VNNI, AVX-VNNI or AMX-INT8), whose sums of
    u8 x s8 products cannot overflow (AVX2's vpmaddubsw saturates at 16 bits)."""
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


def resolve_device(device: str | torch.device | None) -> torch.device:
    """"cpu" / "cuda" / "cuda:N" / a torch.device -> a device torch can compute on here (None: the CPU), or an
    ``InputError`` that says what this machine has instead."""
    if device is None:
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise InputError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from error
    if resolved.type == "cpu":
        return resolved
    if resolved.type != "cuda":
        raise InputError(f"encoderkit computes on the CPU or a CUDA GPU, not on {resolved.type!r}: use cpu or cuda")
    if not torch.cuda.is_available():
        raise InputError(f"device {device!r} asked for a CUDA GPU, but torch sees none (torch.cuda.is_available() "
                         f"is False; this torch {'has no CUDA support' if torch.version.cuda is None else 'found no GPU'}"
                         "): use device cpu")
    count = torch.cuda.device_count()
    if resolved.index is not None and resolved.index >= count:
        raise InputError(f"device {device!r}: torch sees {count} CUDA GPU{'s' if count != 1 else ''} "
                         f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})")
    return resolved


def device_has_native_bf16(device: torch.device) -> bool:
    """True where ``device`` multiplies bf16 matrices in hardware: a CPU with AVX512-BF16/AMX, a GPU from Ampere on."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return cpu_has_native_bf16()


def resolve_dtype(dtype: str | torch.dtype, device: torch.device | None = None) -> torch.dtype:
    """"fp32" / "bf16" / "auto" (bf16 only where ``device``, the CPU by default, runs it natively) -> a dtype."""
    device = device or torch.device("cpu")
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16):
            raise InputError(f"encoderkit computes in float32 or bfloat16, not {dtype}")
        return dtype
    name = str(dtype).lower()
    if name == "int8":
        raise InputError("int8 is for inference only (embedding, search, the task pipelines, the server): "
                         "training computes in fp32 or bf16; choose --dtype fp32, bf16 or auto")
    if name == "auto":
        chosen = torch.bfloat16 if device_has_native_bf16(device) else torch.float32
        log.info("dtype auto -> %s", "bf16 (native bf16 matrix units)" if chosen == torch.bfloat16 else "fp32")
        return chosen
    if name not in _NAMES:
        raise InputError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_CHOICES)} "
                         "(or int8, for inference only)")
    if _NAMES[name] == torch.bfloat16 and device.type == "cpu" and not cpu_has_native_bf16():
        warn_emulated_bf16()
    return _NAMES[name]


def warn_emulated_bf16() -> None:
    """bf16 asked for on a CPU without bf16 matrix units: torch emulates it, far slower than fp32 (on an AVX2-only
    EPYC, two orders of magnitude for a matrix product: bench/encode.py)."""
    log.warning("this CPU has no native bf16 (neither avx512_bf16 nor amx_bf16 in its flags): bf16 is emulated "
                "here and much slower than fp32. Use --dtype auto (fp32 on this CPU), or --dtype int8 for "
                "inference at lower precision.")


# Padded tokens per inference batch, by what the batch is for and the compute dtype: the best measured on the
# embedding bench (BENCHMARKS.md); task pipelines and scanners run heads on every token and take twice as many.
# int8 keys its budgets by name (its non-linear parts compute in fp32).
TOKEN_BUDGETS = {
    "embed": {torch.float32: 2048, torch.bfloat16: 4096, "int8": 2048},
    "task": {torch.float32: 4096, torch.bfloat16: 8192, "int8": 4096},
}


# A GPU's batches hold this many times the CPU's tokens: near the best budget bench/gpu.py found on a GPU for fp32 and
# bf16 (the CPU's budgets left half the speed unused there), while larger factors gained little for several times
# the activation memory of larger models (BENCHMARKS.md, "On a GPU").
GPU_BUDGET_FACTOR = 8


@dataclass(frozen=True)
class Precision:
    """The compute dtype of an inference job and its batch size in tokens, resolved once from the user's choice.

    ``int8``: the encoder's linear layers run in int8 (``modeling.inference.Int8Prepacked``), everything else in
    ``dtype`` (fp32); ``fp32_layers`` names linears kept in fp32 (``"layers.5.ffn_out"``); ``smoothing``:
    SmoothQuant, each layer's strength calibrated on the accuracy guard's texts. See
    ``encoderkit.quantization``."""

    dtype: torch.dtype
    token_budget: int
    int8: bool = False
    fp32_layers: tuple[str, ...] = ()
    smoothing: bool = True

    @property
    def name(self) -> str:
        return "int8" if self.int8 else {torch.float32: "fp32", torch.bfloat16: "bf16"}[self.dtype]

    @classmethod
    def resolve(cls, dtype: str | torch.dtype = "fp32", purpose: str = "task", token_budget: int | None = None,
                at_least: int = 0, device: torch.device | None = None) -> "Precision":
        """``dtype``: "fp32" / "bf16" / "int8" / "auto" / a torch dtype / a Precision (kept as it is);
        ``purpose``: a key of ``TOKEN_BUDGETS``; ``at_least``: the longest sequence a batch must hold (a budget
        below it is raised to it); ``device``: where the model computes (None: the CPU), which decides what
        "auto" means and whether int8 is there at all."""
        device = device or torch.device("cpu")
        if isinstance(dtype, Precision):
            return dtype
        if isinstance(dtype, str) and dtype.lower() == "int8":
            if device.type != "cpu":
                raise InputError(f"int8 runs on the CPU only (its kernels are the CPU's), not on {device}: "
                                 "use --dtype bf16 or auto on a GPU, or --device cpu for int8")
            return cls.quantized(purpose, token_budget=token_budget, at_least=at_least)
        resolved = resolve_dtype(dtype, device)
        return cls(resolved, _budget(token_budget, purpose, resolved, at_least, device))

    @classmethod
    def quantized(cls, purpose: str = "task", *, fp32_layers: tuple[str, ...] | list[str] = (),
                  smoothing: bool = True, token_budget: int | None = None,
                  at_least: int = 0) -> "Precision":
        """int8 linear layers, except those named in ``fp32_layers`` (e.g. the worst of a
        ``QuantizationReport.layer_errors``)."""
        if isinstance(fp32_layers, str):
            fp32_layers = (fp32_layers,)
        return cls(torch.float32, _budget(token_budget, purpose, "int8", at_least), True, tuple(fp32_layers),
                   bool(smoothing))


def _budget(token_budget: int | None, purpose: str, key: torch.dtype | str, at_least: int,
            device: torch.device | None = None) -> int:
    """``token_budget``, or the default for ``purpose`` and ``key``; at least ``at_least``. On a GPU the default
    (so raised) is ``GPU_BUDGET_FACTOR`` times larger."""
    budget = token_budget if token_budget is not None else TOKEN_BUDGETS[purpose][key]
    if budget <= 0:
        raise InputError(f"token_budget must be positive, found {budget}")
    budget = max(budget, at_least)
    if token_budget is None and device is not None and device.type == "cuda":
        budget *= GPU_BUDGET_FACTOR
    return budget
