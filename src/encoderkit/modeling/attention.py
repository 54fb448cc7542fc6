"""Bidirectional multi-head self-attention on torch SDPA, with an explicit path that returns probabilities."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig
from ..errors import InputError


def padding_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """An additive key mask of shape (batch, 1, 1, keys): 0 for real tokens, the dtype's minimum for padding.

    Returns None when nothing is padded, so SDPA can take its unmasked kernel. The minimum (not -inf)
    keeps a fully padded row finite, as transformers does.
    """
    if attention_mask is None or bool(attention_mask.all()):
        return None
    keep = attention_mask[:, None, None, :].to(torch.bool)
    bias = torch.zeros(keep.shape, dtype=dtype, device=attention_mask.device)
    return bias.masked_fill(~keep, torch.finfo(dtype).min)


def causal_bias(length: int, dtype: torch.dtype, device: torch.device | str | None = None) -> torch.Tensor:
    """An additive (1, 1, length, length) mask that lets query i see keys 0..i only (a decoder's mask).

    The encoders here are bidirectional; this exists to show what a left-to-right mask changes.
    """
    above_diagonal = torch.ones(length, length, dtype=torch.bool, device=device).triu(1)
    bias = torch.zeros(length, length, dtype=dtype, device=device).masked_fill(above_diagonal, torch.finfo(dtype).min)
    return bias[None, None]


def check_attention_bias(bias: torch.Tensor, batch: int, length: int, heads: int) -> None:
    """InputError unless ``bias`` has shape (batch or 1, heads or 1, length, length)."""
    shape = tuple(bias.shape)
    if len(shape) != 4 or shape[0] not in (1, batch) or shape[1] not in (1, heads) or shape[2:] != (length, length):
        raise InputError(f"attention_bias must have shape (batch or 1, heads or 1, {length}, {length}), found {shape}")


def combine_biases(padding: torch.Tensor | None, extra: torch.Tensor | None) -> torch.Tensor | None:
    """The sum of two additive masks, clamped at the dtype's minimum: two masked entries would overflow to
    -inf, and a row of -inf gives NaN probabilities where one of the minimum stays finite."""
    if extra is None:
        return padding
    if padding is None:
        return extra
    return (padding + extra).clamp(min=torch.finfo(padding.dtype).min)


class SelfAttention(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)
        self.dropout_p = config.attention_probs_dropout_prob

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self, x: torch.Tensor, bias: torch.Tensor | None, return_probs: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        dropout_p = self.dropout_p if self.training else 0.0
        probs = None
        if return_probs:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            if bias is not None:
                scores = scores + bias
            probs = scores.softmax(dim=-1)
            context = torch.matmul(F.dropout(probs, dropout_p, self.training), v)
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        batch, _, length, _ = context.shape
        context = context.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        return self.output(context), probs
