"""The activations of int8 products: each row quantised to uint8 with its own scale and zero point.

Why per row (per token), not one scale for the matrix: an inference batch packs the tokens of many texts into one
matrix, so one scale for the matrix lets one text with outlier activations (all-mpnet-base-v2 has tokens whose
activations are hundreds of times the rest) take the resolution of every text beside it. Measured on
all-mpnet-base-v2 (bench/int8_batches.py), one scale per matrix gave batches of 32 a mean cosine of 0.91 to fp32;
per row, a text's codes do not depend on its batch at all. The native kernel (``encoderkit.native``) quantises its
products' rows with the same arithmetic, step for step (``quantize`` in small_batch.cpp).

The arithmetic, for a row x (after the SmoothQuant division): lo = min(min(x), 0), hi = max(max(x), 0); scale =
max(hi - lo, 1e-12) / 255 in float64; zero point = round(-lo / scale) within 0..255; codes = round(x * float32(1 /
scale)) + zero point within 0..255, rounded half to even. The product is then (codes - zero point) * scale times
the dequantised weights.

On the CPU, the codes are multiplied by oneDNN's int8 product (``onednn.qlinear_pointwise``), which takes one scale
for its input: it gets the codes themselves (scale 1, zero point 0), and ``rescale_rows`` applies each row's scale
and zero point to its output. Both passes run in the native library where it is built (one pass each, on torch's
threads), else as torch ops (the same numbers, a few more passes over memory).
"""
from __future__ import annotations

import ctypes
from typing import Callable

import torch

LEVELS = 255  # uint8 codes: 0..255

# The native library's loader, given by ``modeling.kernels`` when it is imported (with the encoder's modules). This
# module cannot import it: ``modeling.inference`` imports this one, and the native package imports that.
_library: Callable[[], ctypes.CDLL | None] = lambda: None


def use_library(loader: Callable[[], ctypes.CDLL | None]) -> None:
    """Take the native library from ``loader`` (``modeling.kernels.library``)."""
    global _library
    _library = loader


def uint8_rows(rows: torch.Tensor, inverse_smoothing: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor,
                                                                                      torch.Tensor]:
    """(M, K) fp32 rows (times ``inverse_smoothing`` per channel) -> codes 0..255 as floats (M, K), and each row's
    scale and zero point ((M, 1) fp32 each), by the arithmetic of the module doc."""
    if inverse_smoothing is not None:
        rows = rows * inverse_smoothing
    if rows.shape[0] == 0:
        empty = rows.new_zeros(0, 1)
        return rows.clone(), empty, empty.clone()
    low = rows.amin(dim=1, keepdim=True).clamp_(max=0.0).double()
    high = rows.amax(dim=1, keepdim=True).clamp_(min=0.0).double()
    scale = (high - low).clamp_(min=1e-12) / LEVELS
    zero = torch.round(-low / scale).clamp_(0, LEVELS)
    codes = torch.round(rows * (1.0 / scale).float()).add_(zero.float()).clamp_(0, LEVELS)
    return codes, scale.float(), zero.float()


def _native() -> ctypes.CDLL | None:
    """The native library where it is built (and ``modeling.kernels`` was imported), else None."""
    return _library()


def quantize_rows(rows: torch.Tensor, inverse_smoothing: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor,
                                                                                         torch.Tensor]:
    """``uint8_rows`` for oneDNN's product: (M, K) uint8 codes, each row's scale (M,) and zero point (M,) as
    int32, from the native library in one pass where it is built (for K a multiple of 4, as every model's)."""
    lib = _native()
    rows = rows.float().contiguous()
    count, width = rows.shape
    if lib is None or width % 4 or count == 0:
        codes, scale, zero = uint8_rows(rows, inverse_smoothing)
        return codes.to(torch.uint8), scale.view(-1), zero.view(-1).to(torch.int32)
    codes = torch.empty(count, width, dtype=torch.uint8)
    scale, zero = torch.empty(count), torch.empty(count, dtype=torch.int32)
    inverse = None if inverse_smoothing is None else inverse_smoothing.float().contiguous()
    lib.ek_quantize_rows(rows.data_ptr(), count, width, None if inverse is None else inverse.data_ptr(),
                         codes.data_ptr(), scale.data_ptr(), zero.data_ptr(), torch.get_num_threads())
    return codes, scale, zero


def rescale_rows(out: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, weight_sums: torch.Tensor,
                 bias: torch.Tensor) -> torch.Tensor:
    """In place: (M, N) products of the codes with the dequantised weights -> (product - zero point * weight sum)
    * scale + bias, per row's ``scale`` and ``zero`` point; ``weight_sums``: each output's sum of dequantised
    weights (N,)."""
    lib = _native()
    if lib is None or not out.is_contiguous() or out.shape[0] == 0:
        return out.mul_(scale[:, None]).addr_(-(zero.float() * scale), weight_sums).add_(bias)
    lib.ek_rescale_rows(out.data_ptr(), out.shape[0], out.shape[1], scale.data_ptr(), zero.data_ptr(),
                        weight_sums.data_ptr(), bias.data_ptr(), torch.get_num_threads())
    return out
