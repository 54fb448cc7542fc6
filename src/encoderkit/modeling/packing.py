"""The one token layout of the encoder, for training and inference alike.

Every layer works on a 2-D matrix of token states, (tokens, hidden). ``Packing`` says which sequence each
row belongs to and how to form the attention grids:

- packed: only the real tokens, back to back (``Packing.from_mask`` for a padded training batch, which
  unpads once at the model's entry and re-pads once at its exit; ``Packing.from_lengths`` for the inference
  engine, which never builds a padded batch). Attention has to see whole sequences, so it runs on groups of
  sequences of similar length, each re-padded only to its own longest member (``length_groups``).
- padded: the whole (batch, length) grid flattened, one attention group, padding masked by a key bias. This
  is what ``output_attentions`` and an extra ``attention_bias`` use, since they need the full grid.

In every grid a sequence starts at column 0, so a token's column is its position in its sequence: rotary
and relative position schemes read positions from the grid.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

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
    (default ``GROUP_OVERHEAD``; 0 gives one group per distinct length, with no padding at all).
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

    gather: torch.Tensor | None  # (count * length,) the token row in each slot (padding slots repeat a real
    #                              row); None: the rows are the grid already, in order
    real: torch.Tensor | None  # (the group's tokens,) the slots that hold real tokens; None when none is padding
    count: int
    length: int
    key_mask: torch.Tensor | None  # (count, length) bool, True for real tokens; None when none is padding
    bias: torch.Tensor | None  # (count or 1, 1 or heads, length or 1, length) additive mask; None: nothing masked
    start: int = 0  # with ``gather`` None: the group is rows start .. start + count * length, a view, no copy

    def grid(self, rows: torch.Tensor) -> torch.Tensor:
        """(tokens, ...) -> (count, length, ...): the group's sequences, padded."""
        if self.gather is None:
            picked = rows[self.start:self.start + self.count * self.length]  # a view
        else:
            picked = rows.index_select(0, self.gather)
        return picked.view(self.count, self.length, *rows.shape[1:])

    def ungrid(self, grid: torch.Tensor) -> torch.Tensor:
        """(count, length, ...) -> (the group's real tokens, ...)."""
        flat = grid.reshape(self.count * self.length, *grid.shape[2:])
        return flat if self.real is None else flat.index_select(0, self.real)


@dataclass
class Packing:
    """Where each row of a (tokens, hidden) state matrix sits: its sequence, its position, its attention group.

    ``indices``, ``batch`` and ``length`` describe the padded (batch, length) grid the tokens came from, when
    they came from one (``from_mask``); ``padded`` is True when the rows *are* that whole grid."""

    lengths: torch.Tensor  # (sequences,) real tokens per sequence
    cu_seqlens: torch.Tensor  # (sequences + 1,) the first row of each sequence
    positions: torch.Tensor  # (tokens,) each token's position in its sequence
    sequence_index: torch.Tensor  # (tokens,) which sequence each token belongs to
    groups: list[AttentionGroup]
    restore: torch.Tensor | None  # (tokens,) each token's row in the groups' concatenated outputs; None: same row
    indices: torch.Tensor | None = None  # (tokens,) positions of the tokens in the flattened padded grid
    batch: int = 0
    length: int = 0
    padded: bool = False

    @property
    def num_sequences(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def in_row_order(self) -> bool:
        """Every group is a contiguous, unpadded run of rows and the groups come in row order: outputs can be
        written into place, with no gathering."""
        return self.restore is None and not self.padded and all(g.gather is None and g.real is None
                                                                for g in self.groups)

    @property
    def max_length(self) -> int:
        return max((group.length for group in self.groups), default=0)

    # ----- construction -------------------------------------------------------------------------
    @classmethod
    def from_lengths(cls, lengths: np.ndarray | list[int], *, overhead: float | None = None,
                     device: torch.device | str | None = None, mask_dtype: torch.dtype = torch.float32) -> "Packing":
        """Sequences packed back to back in the given order (no padded grid anywhere)."""
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        total = int(starts[-1])
        positions = np.arange(total) - np.repeat(starts[:-1], lengths)
        as_tensor = lambda a: torch.as_tensor(a, device=device)  # noqa: E731
        tables = (as_tensor(lengths), as_tensor(starts), as_tensor(positions),
                  as_tensor(np.repeat(np.arange(len(lengths)), lengths)))
        if overhead == 0 and len(lengths) and lengths.min() > 0 and bool((np.diff(lengths) <= 0).all()):
            # The engine's case: sorted longest first, one group per run of equal lengths, each a view of rows.
            cuts = np.concatenate([[0], np.flatnonzero(np.diff(lengths)) + 1, [len(lengths)]])
            groups = [AttentionGroup(None, None, int(end - begin), int(lengths[begin]), None, None, int(starts[begin]))
                      for begin, end in zip(cuts[:-1], cuts[1:])]
            return cls(*tables, groups, None)
        groups, placed = [], []
        nonempty = np.flatnonzero(lengths)  # an all-padding row has no token to attend with
        for members in (nonempty[group] for group in length_groups(lengths[nonempty], overhead)):
            longest = int(lengths[members[0]])  # groups come sorted longest first
            within = np.arange(longest)
            grid_real = within[None, :] < lengths[members][:, None]  # (count, longest)
            # Padding slots point at the sequence's first token: finite values, masked as keys, outputs unused.
            rows = starts[members][:, None] + np.where(grid_real, within[None, :], 0)
            padded = not bool(grid_real.all())
            key_mask = torch.as_tensor(grid_real, device=device) if padded else None
            real = torch.as_tensor(np.flatnonzero(grid_real), device=device) if padded else None
            flat = rows.reshape(-1)
            contiguous = not padded and bool((np.diff(flat) == 1).all())  # e.g. a run of equal, sorted lengths
            groups.append(AttentionGroup(None if contiguous else torch.as_tensor(flat, device=device), real,
                                         len(members), longest, key_mask, padding_bias(key_mask, mask_dtype),
                                         int(flat[0]) if contiguous else 0))
            placed.append(rows[grid_real])
        order = np.concatenate(placed) if placed else np.zeros(0, dtype=np.int64)  # the rows as groups return them
        restore = None
        if not np.array_equal(order, np.arange(len(order))):  # e.g. length-sorted batches come back in order
            restore = np.empty_like(order)
            restore[order] = np.arange(len(order))
            restore = torch.as_tensor(restore, device=device)
        return cls(*tables, groups, restore)

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor, dtype: torch.dtype, overhead: float | None = None) -> "Packing":
        """The real tokens of a padded (batch, length) batch; their padding may sit anywhere in the row."""
        batch, length = attention_mask.shape
        mask = attention_mask.to(torch.bool)
        packing = cls.from_lengths(mask.sum(1).cpu().numpy(), overhead=overhead, device=attention_mask.device,
                                   mask_dtype=dtype)
        packing.indices = mask.reshape(-1).nonzero().squeeze(1)
        packing.batch, packing.length = batch, length
        return packing

    @classmethod
    def padded_grid(cls, attention_mask: torch.Tensor | None, batch: int, length: int, dtype: torch.dtype,
                    extra_bias: torch.Tensor | None = None, device: torch.device | str | None = None) -> "Packing":
        """The whole (batch, length) grid as rows, one attention group; padding keys masked."""
        if attention_mask is None:
            attention_mask = torch.ones(batch, length, dtype=torch.long, device=device)
        mask = attention_mask.to(torch.bool)
        key_mask = None if bool(mask.all()) else mask
        bias = combine_biases(padding_bias(attention_mask, dtype), extra_bias)
        group = AttentionGroup(None, None, batch, length, key_mask, bias)
        lengths = mask.sum(1)
        positions = torch.arange(length, device=mask.device).repeat(batch)
        return cls(lengths, torch.arange(batch + 1, device=mask.device) * length, positions,
                   torch.arange(batch, device=mask.device).repeat_interleave(length), [group], None,
                   indices=None, batch=batch, length=length, padded=True)

    # ----- moving states between layouts ----------------------------------------------------------
    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """(batch, length, ...) -> (rows, ...)."""
        flat = padded.reshape(self.batch * self.length, *padded.shape[2:])
        return flat if self.padded else flat.index_select(0, self.indices)

    def pad(self, tokens: torch.Tensor) -> torch.Tensor:
        """(rows, ...) -> (batch, length, ...), zeros at padding (differentiable)."""
        if self.padded:
            return tokens.view(self.batch, self.length, *tokens.shape[1:])
        grid = tokens.new_zeros(self.batch * self.length, *tokens.shape[1:])
        return grid.index_copy(0, self.indices, tokens).view(self.batch, self.length, *tokens.shape[1:])

    def gather_groups(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """The groups' outputs (each (its real tokens, ...)) back in row order."""
        if not outputs:
            raise ValueError("a batch without a single real token")
        joined = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
        return joined if self.restore is None else joined.index_select(0, self.restore)

    def zero_padding(self, grid: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
        """A group's (count, length, ...) grid with its padding slots set to zero."""
        if group.key_mask is None:
            return grid
        return grid * group.key_mask.view(group.count, group.length, *([1] * (grid.dim() - 2))).to(grid.dtype)

    def first_tokens(self, states: torch.Tensor) -> torch.Tensor:
        """Each sequence's first row ([CLS]): (sequences, ...)."""
        return states.index_select(0, self.cu_seqlens[:-1])


POOLING = ("mean", "cls", "max", "weightedmean", "mean_sqrt_len")


def pool_padded(hidden: torch.Tensor, attention_mask: torch.Tensor | None, mode: str) -> torch.Tensor:
    """Reduce padded (batch, length, dim) token states to (batch, dim), ignoring padding (None: none)."""
    if mode == "cls":
        return hidden[:, 0]
    if attention_mask is None:
        attention_mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "max":
        return hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min).max(dim=1).values
    if mode == "weightedmean":  # later positions weigh more (SGPT)
        weights = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype)
        mask = mask * weights[None, :, None]
    if mode in ("mean", "weightedmean", "mean_sqrt_len"):
        summed = (hidden * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        return summed / (counts.sqrt() if mode == "mean_sqrt_len" else counts)
    raise InputError(f"unknown pooling {mode!r}; choose one of {', '.join(POOLING)}")


def pool_packed(hidden: torch.Tensor, packing: Packing, mode: str) -> torch.Tensor:
    """Pool packed token states per sequence: mean / cls / max / weightedmean / mean_sqrt_len."""
    size = (packing.num_sequences, hidden.shape[1])
    if mode == "cls":
        return packing.first_tokens(hidden)
    lengths = packing.lengths.to(hidden.dtype)
    if mode == "max":
        index = packing.sequence_index[:, None].expand_as(hidden)
        return hidden.new_zeros(size).scatter_reduce_(0, index, hidden, "amax", include_self=False)
    weights = None
    if mode == "weightedmean":
        weights = (packing.positions + 1).to(hidden.dtype)
    summed = hidden.new_zeros(size).index_add_(0, packing.sequence_index,
                                               hidden if weights is None else hidden * weights[:, None])
    if mode == "mean":
        return summed / lengths[:, None]
    if mode == "mean_sqrt_len":
        return summed / lengths[:, None].sqrt()
    if mode == "weightedmean":
        totals = hidden.new_zeros(packing.num_sequences).index_add_(0, packing.sequence_index, weights)
        return summed / totals[:, None]
    raise ValueError(f"unknown pooling {mode!r}")


def plan_batches(lengths: list[int] | np.ndarray, token_budget: int, max_batch_size: int = 512) -> list[np.ndarray]:
    """Group sequence indices, longest first, so that batch_size * longest <= token_budget."""
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    batches, start = [], 0
    while start < len(order):
        longest = max(int(lengths[order[start]]), 1)
        size = max(1, min(max_batch_size, token_budget // longest))
        batches.append(order[start:start + size])
        start += size
    return batches


__all__ = ["AttentionGroup", "GROUP_OVERHEAD", "Packing", "combine_biases", "length_groups", "padding_bias",
           "plan_batches", "pool_packed", "pool_padded"]
