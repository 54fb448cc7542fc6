"""Bidirectional multi-head self-attention on torch SDPA, with an explicit path that returns probabilities.

Two layouts of the token states are supported:
- padded: (batch, length, hidden), padding keys masked by an additive bias;
- unpadded: (tokens, hidden), only the real tokens of the batch (see ``Unpadding``). The dense
  projections then run on real tokens alone; the states are re-padded only for the attention product.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

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

@dataclass
class Unpadding:
    """Where the real tokens of a padded (batch, length) batch are, to move states between the layouts."""

    indices: torch.Tensor  # (tokens,) positions of the real tokens in the flattened (batch * length) grid
    batch: int
    length: int
    bias: torch.Tensor  # (batch, 1, 1, length) additive key mask for the re-padded attention

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor, dtype: torch.dtype) -> "Unpadding":
        batch, length = attention_mask.shape
        indices = attention_mask.reshape(-1).nonzero().squeeze(1)
        return cls(indices, batch, length, padding_bias(attention_mask, dtype))

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """(batch, length, ...) -> (tokens, ...)."""
        return padded.reshape(self.batch * self.length, *padded.shape[2:]).index_select(0, self.indices)

    def pad(self, tokens: torch.Tensor) -> torch.Tensor:
        """(tokens, ...) -> (batch, length, ...), zeros at padding (differentiable)."""
        grid = tokens.new_zeros(self.batch * self.length, *tokens.shape[1:])
        return grid.index_copy(0, self.indices, tokens).view(self.batch, self.length, *tokens.shape[1:])


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

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        """Query, key and value in one matrix product (one tall GEMM beats three narrow ones)."""
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        return F.linear(x, weight, bias)

    def forward(
        self, x: torch.Tensor, bias: torch.Tensor | None, return_probs: bool = False,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        qkv = self._qkv(x)
        if unpadding is not None:  # (tokens, 3 * hidden): re-pad for the attention product only
            qkv = unpadding.pad(qkv)
            bias = unpadding.bias
        batch, length, _ = qkv.shape
        q, k, v = qkv.view(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
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
        context = context.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        if unpadding is not None:
            context = unpadding.unpad(context)
        return self.output(context), probs
