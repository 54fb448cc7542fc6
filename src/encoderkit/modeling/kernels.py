"""The one module through which ``modeling/`` reaches the native library (``encoderkit.native``): the training
kernels (attention probabilities, dropout, residual + dropout + LayerNorm, through ``library()``), the int8
products' quantisation of rows and rescaling of outputs (``int8_rows``, given ``library`` here), the inference
kernel for short batches (``native_forward``) and the inference attention of longer ones (``native_attention``).
Each returns None, or is not called, where the library is absent or declines, and the callers then run PyTorch's
operations."""
from __future__ import annotations

from typing import Any

import torch

from .. import native
from . import int8_rows


def library() -> Any:
    """The loaded native library (ctypes), or None where it could not be built or loaded."""
    return native.library()


int8_rows.use_library(library)


def native_forward(encoder: torch.nn.Module, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                   position_ids: torch.Tensor | None, packing: Any) -> torch.Tensor | None:
    """The last layer's states of a short packed batch from the native kernel, or None where it does not apply."""
    return native.native_forward(encoder, input_ids, token_type_ids, position_ids, packing)


def native_attention(qkv: torch.Tensor, starts: torch.Tensor, heads: int, scale: float,
                     longest: int, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """Packed self-attention for inference, (tokens, 3 * hidden) q | k | v -> (tokens, hidden), plus ``bias`` by
    relative position (``native_bias_layout``'s) where given, from the native library (``native.attention``), or
    None where it does not apply."""
    return native.attention(qkv, starts, heads, scale, longest, bias)


def native_bias_layout(position_bias: torch.nn.Module, longest: int) -> torch.Tensor | None:
    """MPNet's bias by relative position laid out for ``native_attention`` (``native.bias_layout``), or None where
    the library is not built."""
    return native.bias_layout(position_bias, longest)
