"""Bidirectional multi-head self-attention on torch SDPA, with an explicit path that returns probabilities.

Two layouts of the token states are supported:
- padded: (batch, length, hidden), padding keys masked by an additive bias;
- unpadded: (tokens, hidden), only the real tokens of the batch (see ``Unpadding``). The dense
  projections then run on real tokens alone; for the attention product the sequences are re-padded in
  groups of similar length.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
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


GROUP_OVERHEAD = 64 * 64  # the fixed cost of one more attention call, in units of (sequences x length^2)


def length_groups(lengths: np.ndarray, overhead: float | None = None) -> list[np.ndarray]:
    """Split sequences into groups of similar length whose attention is cheapest in total.

    A group is padded to its longest sequence, and attention costs about ``count * longest**2`` (with
    dropout the score matrix is materialised, so this is what training pays), plus ``overhead`` per group
    (default ``GROUP_OVERHEAD``).
    The sequences, sorted longest first, are cut into contiguous groups by dynamic programming over the
    runs of equal length. Returns the sequence indices of each group, longest group first."""
    overhead = GROUP_OVERHEAD if overhead is None else overhead
    order = np.argsort(-lengths, kind="stable")
    run_lengths, run_counts = np.unique(lengths, return_counts=True)
    run_lengths, run_counts = run_lengths[::-1].astype(np.float64), run_counts[::-1]  # longest first, as ``order``
    before = np.concatenate([[0], np.cumsum(run_counts)])  # sequences before run i
    runs = len(run_lengths)
    best = np.zeros(runs + 1)  # best[j]: cheapest split of the first j runs
    cut = np.zeros(runs + 1, dtype=np.int64)
    for j in range(1, runs + 1):
        starts = np.arange(j)  # a group of runs start..j-1, padded to run start's length
        costs = best[:j] + (before[j] - before[starts]) * run_lengths[starts] ** 2 + overhead
        cut[j] = int(np.argmin(costs))
        best[j] = costs[cut[j]]
    bounds, j = [], runs
    while j > 0:
        bounds.append((int(before[cut[j]]), int(before[j])))
        j = int(cut[j])
    return [order[start:end] for start, end in reversed(bounds)]


@dataclass
class AttentionGroup:
    """Sequences attended together, padded to the longest of them: a (count, length) grid of token slots."""

    gather: torch.Tensor  # (count * length,) the packed-token row in each slot; padding slots repeat a real row
    real: torch.Tensor | None  # (the group's tokens,) the slots that hold real tokens; None when none is padding
    count: int
    length: int
    bias: torch.Tensor | None  # (count, 1, 1, length) additive key mask; None when none is padding


@dataclass
class Unpadding:
    """Where the real tokens of a padded (batch, length) batch are, to move states between the layouts.

    Attention has to see whole sequences, so it runs on groups of sequences of similar length, each
    re-padded only to its own longest sequence: with random batches this pads a few percent instead of
    half the grid (see ``length_groups``)."""

    indices: torch.Tensor  # (tokens,) positions of the real tokens in the flattened (batch * length) grid
    batch: int
    length: int
    groups: list[AttentionGroup]
    restore: torch.Tensor | None  # (tokens,) each packed token's row in the groups' outputs; None: the same row

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor, dtype: torch.dtype) -> "Unpadding":
        batch, length = attention_mask.shape
        device = attention_mask.device
        mask = attention_mask.to(torch.bool)
        indices = mask.reshape(-1).nonzero().squeeze(1)
        lengths = mask.sum(1).cpu().numpy()
        # Each row's real tokens are contiguous in the packed order, wherever the row's padding is.
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        groups, placed = [], []
        nonempty = np.flatnonzero(lengths)  # an all-padding row has no token to attend with
        for members in (nonempty[group] for group in length_groups(lengths[nonempty])):
            longest = int(lengths[members[0]])  # groups come sorted longest first
            within = np.arange(longest)
            grid_real = within[None, :] < lengths[members][:, None]  # (count, longest)
            # Padding slots point at the sequence's first token: finite values, masked as keys, outputs unused.
            rows = starts[members][:, None] + np.where(grid_real, within[None, :], 0)
            bias = padding_bias(torch.as_tensor(grid_real, device=device), dtype)
            real = None if bias is None else torch.as_tensor(np.flatnonzero(grid_real), device=device)
            groups.append(AttentionGroup(torch.as_tensor(rows.reshape(-1), device=device), real, len(members),
                                         longest, bias))
            placed.append(rows[grid_real])
        order = np.concatenate(placed) if placed else np.zeros(0, dtype=np.int64)  # the rows as groups return them
        restore = None
        if not np.array_equal(order, np.arange(len(order))):  # e.g. length-grouped batches come back in order
            restore = np.empty_like(order)
            restore[order] = np.arange(len(order))
            restore = torch.as_tensor(restore, device=device)
        return cls(indices, batch, length, groups, restore)

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """(batch, length, ...) -> (tokens, ...)."""
        return padded.reshape(self.batch * self.length, *padded.shape[2:]).index_select(0, self.indices)

    def pad(self, tokens: torch.Tensor) -> torch.Tensor:
        """(tokens, ...) -> (batch, length, ...), zeros at padding (differentiable)."""
        grid = tokens.new_zeros(self.batch * self.length, *tokens.shape[1:])
        return grid.index_copy(0, self.indices, tokens).view(self.batch, self.length, *tokens.shape[1:])

    def attend(self, qkv: torch.Tensor, num_heads: int, dropout_p: float) -> torch.Tensor:
        """SDPA of packed (tokens, 3 * hidden) queries, keys and values, group by group: (tokens, hidden)."""
        hidden = qkv.shape[1] // 3
        outputs = []
        for group in self.groups:
            grid = qkv.index_select(0, group.gather).view(group.count, group.length, 3, num_heads, -1)
            q, k, v = grid.permute(2, 0, 3, 1, 4).unbind(0)
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=group.bias, dropout_p=dropout_p)
            context = context.transpose(1, 2).reshape(group.count * group.length, hidden)
            outputs.append(context if group.real is None else context.index_select(0, group.real))
        if not outputs:  # a batch without a single real token
            return qkv.new_zeros(0, hidden)
        context = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
        return context if self.restore is None else context.index_select(0, self.restore)


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
        dropout_p = self.dropout_p if self.training else 0.0
        if unpadding is not None:  # (tokens, 3 * hidden): attention on groups of similar length
            return self.output(unpadding.attend(qkv, self.num_heads, dropout_p)), None
        batch, length, _ = qkv.shape
        q, k, v = qkv.view(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
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
        return self.output(context), probs
