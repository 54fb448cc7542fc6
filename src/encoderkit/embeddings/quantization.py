"""Embedding quantization: int8 with calibrated per-dimension ranges, and binary (sign bits).

The codes are those of sentence-transformers' ``quantize_embeddings`` (tested against it):

- int8: each dimension's [min, max], taken from a calibration set, is cut into 255 equal steps;
  a value's code is floor((x - min) / step) clipped to 0..255, minus 128 (4x smaller than float32).
- binary: one bit per dimension, set where the value is positive, packed 8 to a byte (32x smaller).
  ``ubinary`` is the packed bytes as uint8; ``binary`` the same bytes minus 128 as int8.

Quantized vectors retrieve candidates; the float vectors rescore them (see ``CompressedIndex``).
"""
from __future__ import annotations

import numpy as np

from ..errors import InputError

PRECISIONS = ("int8", "uint8", "binary", "ubinary")


def calibration_ranges(calibration: np.ndarray) -> np.ndarray:
    """Each dimension's (min, max) over a calibration set: an array of shape (2, dimension)."""
    array = np.asarray(calibration, dtype=np.float32)
    if array.ndim != 2 or len(array) < 2:
        raise InputError(f"int8 calibration needs at least 2 vectors of shape (n, dimension), found {array.shape}")
    return np.vstack([array.min(axis=0), array.max(axis=0)])


def _steps(ranges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ranges = np.asarray(ranges, dtype=np.float32)
    if ranges.ndim != 2 or ranges.shape[0] != 2:
        raise InputError(f"int8 ranges must have shape (2, dimension), found {ranges.shape}")
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    return starts, np.where(steps == 0, 1, steps).astype(np.float32)


def quantize_uint8(embeddings: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """Codes 0..255 per dimension (the int8 codes plus 128)."""
    starts, steps = _steps(ranges)
    array = np.asarray(embeddings, dtype=np.float32)
    if array.shape[-1] != starts.shape[0]:
        raise InputError(f"embeddings have {array.shape[-1]} dimensions but the ranges {starts.shape[0]}")
    return np.clip(np.floor((array - starts) / steps), 0, 255).astype(np.uint8)


def dequantize_uint8(codes: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """Each code's bucket midpoint (what FAISS's 8-bit scalar quantizer decodes to)."""
    starts, steps = _steps(ranges)
    return starts + (codes.astype(np.float32) + 0.5) * steps


def quantize_ubinary(embeddings: np.ndarray) -> np.ndarray:
    """Sign bits packed into uint8, ceil(dimension / 8) bytes a vector."""
    return np.packbits(np.asarray(embeddings) > 0, axis=-1)


def quantize_embeddings(embeddings: np.ndarray, precision: str, *, ranges: np.ndarray | None = None,
                        calibration: np.ndarray | None = None) -> np.ndarray:
    """Quantize float embeddings to ``precision`` (int8, uint8, binary, ubinary). int8/uint8 use ``ranges``
    (shape (2, dimension)) or the ranges of ``calibration``; give one of them, as one batch's own ranges
    differ from the next batch's."""
    if precision not in PRECISIONS:
        raise InputError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision.endswith("binary"):
        packed = quantize_ubinary(embeddings)
        return packed if precision == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
    if ranges is None:
        if calibration is None:
            raise InputError(f"{precision} quantization needs ranges= or calibration= (a representative sample)")
        ranges = calibration_ranges(calibration)
    codes = quantize_uint8(embeddings, ranges)
    return codes if precision == "uint8" else (codes.astype(np.int16) - 128).astype(np.int8)
