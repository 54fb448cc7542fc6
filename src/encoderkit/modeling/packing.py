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


def padding_bias(key_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """An additive key mask of shape (batch, 1, 1, keys): 0 for real tokens, the dtype's minimum for padding;
    None for no mask. The callers pass None where nothing is padded, so SDPA can take its unmasked kernel. The
    minimum (not -inf) keeps a fully padded row finite, as transformers does.
    """
    if key_mask is None:
        return None
    keep = key_mask[:, None, None, :].to(torch.bool)
    bias = torch.zeros(keep.shape, dtype=dtype, device=key_mask.device)
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


class _GatherRows(torch.autograd.Function):
    """``source.index_select(0, index)`` whose backward is a gather too, not a scatter-add.

    ``inverse[i]`` is the output row that carries source row ``i`` (each source row is carried by exactly one
    output row that receives gradient), or ``len(output)`` when none does. The gradients of the other output
    rows must be zero: attention's padding slots are masked keys whose outputs are dropped, so theirs are.
    torch's own backward of ``index_select`` adds into a zero tensor the size of the source, once per call and
    single-threaded; with a batch in many length groups that was most of a training step."""

    @staticmethod
    def forward(ctx, source: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        return source.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        with_zero = torch.cat([grad, grad.new_zeros(1, *grad.shape[1:])])
        return with_zero.index_select(0, inverse), None, None


@dataclass
class AttentionGroup:
    """Sequences attended together, padded to the longest of them: a (count, length) grid of token slots."""

    count: int
    length: int
    key_mask: torch.Tensor | None  # (count, length) bool, True for real tokens; None when none is padding
    bias: torch.Tensor | None  # (count or 1, 1 or heads, length or 1, length) additive mask; None: nothing masked
    start: int = 0  # the group's first slot in the concatenated grids (= its first row when rows are the grids)
    # (count,) int64: how many keys of each sequence are real, its first ones, where ``bias`` masks exactly the
    # others (and nothing else); None where nothing is masked or the bias is more than that
    valid: torch.Tensor | None = None

    @property
    def slots(self) -> int:
        return self.count * self.length


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
    # The groups' grids concatenated are the "slots". None when the rows are the slots already (the engine's
    # sorted runs, the padded grid); otherwise (slots,) the row in each slot (a padding slot repeats its
    # sequence's first row), (tokens,) each row's real slot, and (slots,) each slot's row or ``tokens`` for padding.
    slot_rows: torch.Tensor | None
    row_slots: torch.Tensor | None = None
    slot_rows_or_pad: torch.Tensor | None = None
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
        return self.slot_rows is None and not self.padded

    @property
    def by_sequence_only(self) -> bool:
        """Rows in order (``in_row_order``) and nothing masked but the other sequences (no group has a padding key mask
        or a bias): ``cu_seqlens`` alone says who attends to whom, all the native kernels take."""
        return self.in_row_order and all(group.key_mask is None and group.bias is None for group in self.groups)

    @property
    def max_length(self) -> int:
        return max((group.length for group in self.groups), default=0)

    # ----- construction -------------------------------------------------------------------------
    @classmethod
    def from_lengths(cls, lengths: np.ndarray | list[int], *, overhead: float | None = None,
                     device: torch.device | str | None = None, mask_dtype: torch.dtype = torch.float32) -> "Packing":
        """Sequences packed back to back in the given order (no padded grid anywhere)."""
        if len(lengths) == 1 and overhead == 0 and int(lengths[0]) > 0:  # one sequence (a served text): no numpy
            n = int(lengths[0])
            return cls(torch.tensor([n], device=device), torch.tensor([0, n], device=device),
                       torch.arange(n, device=device), torch.zeros(n, dtype=torch.int64, device=device),
                       [AttentionGroup(1, n, None, None, 0)], None)
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
            groups = [AttentionGroup(int(end - begin), int(lengths[begin]), None, None, int(starts[begin]))
                      for begin, end in zip(cuts[:-1], cuts[1:])]
            return cls(*tables, groups, None)
        groups, slot_rows, real_slots = [], [], []
        start = 0
        nonempty = np.flatnonzero(lengths)  # an all-padding row has no token to attend with
        for members in (nonempty[group] for group in length_groups(lengths[nonempty], overhead)):
            longest = int(lengths[members[0]])  # groups come sorted longest first
            within = np.arange(longest)
            grid_real = within[None, :] < lengths[members][:, None]  # (count, longest)
            # Padding slots point at the sequence's first token: finite values, masked as keys, outputs unused.
            rows = starts[members][:, None] + np.where(grid_real, within[None, :], 0)
            key_mask = None if bool(grid_real.all()) else torch.as_tensor(grid_real, device=device)
            valid = None if key_mask is None else as_tensor(lengths[members])
            groups.append(AttentionGroup(len(members), longest, key_mask, padding_bias(key_mask, mask_dtype), start,
                                         valid))
            slot_rows.append(rows.reshape(-1))
            real_slots.append(start + np.flatnonzero(grid_real))
            start += rows.size
        slots = np.concatenate(slot_rows) if slot_rows else np.zeros(0, dtype=np.int64)
        real = np.concatenate(real_slots) if real_slots else np.zeros(0, dtype=np.int64)
        if len(slots) == total and np.array_equal(slots, np.arange(total)):  # the rows are the slots already
            return cls(*tables, groups, None)
        row_slots = np.empty(total, dtype=np.int64)
        row_slots[slots[real]] = real
        slot_rows_or_pad = np.full(len(slots), total, dtype=np.int64)
        slot_rows_or_pad[real] = slots[real]
        return cls(*tables, groups, as_tensor(slots), as_tensor(row_slots), as_tensor(slot_rows_or_pad))

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
                    extra_bias: torch.Tensor | None = None, device: torch.device | str | None = None,
                    traceable: bool = False) -> "Packing":
        """The whole (batch, length) grid as rows, one attention group; padding keys masked. ``traceable``: the
        mask is applied even where nothing is padded, so that no step depends on the mask's values (tracing for
        ONNX export records one graph for every input)."""
        if attention_mask is None:
            attention_mask = torch.ones(batch, length, dtype=torch.long, device=device)
        mask = attention_mask.to(torch.bool)
        key_mask = mask if traceable or not bool(mask.all()) else None
        bias = combine_biases(padding_bias(key_mask, dtype), extra_bias)
        lengths = mask.sum(1)
        valid = None
        if key_mask is not None and extra_bias is None and not traceable:
            prefix = torch.arange(length, device=mask.device)[None, :] < lengths[:, None]
            valid = lengths if bool(torch.equal(prefix, mask)) else None  # right padding: each row's first keys
        group = AttentionGroup(batch, length, key_mask, bias, valid=valid)
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

    def to_grids(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """(tokens, ...) -> each group's (count, length, ...) grid: one gather for all groups (none when the rows
        are the slots already), whose backward is a gather as well (``_GatherRows``)."""
        if self.slot_rows is not None:
            rows = _GatherRows.apply(rows, self.slot_rows, self.row_slots)
        # The groups' grids are the slots back to back, so one split cuts them all. Not a slice per group: a slice's
        # backward writes its gradient into a zero tensor the size of all the rows, and autograd then adds those up,
        # one fill and one add of the whole (tokens, 3 x hidden) gradient per group and layer (6% of a SQuAD training
        # step); a split's backward is one cat.
        parts = rows.split([group.slots for group in self.groups])
        return [part.view(group.count, group.length, *rows.shape[1:]) for part, group in zip(parts, self.groups)]

    def from_grids(self, grids: list[torch.Tensor]) -> torch.Tensor:
        """Each group's (count, length, ...) grid -> (tokens, ...) in row order; padding slots dropped."""
        if not grids:
            raise ValueError("a batch without a single real token")
        flat = [grid.reshape(group.slots, *grid.shape[2:]) for grid, group in zip(grids, self.groups)]
        joined = flat[0] if len(flat) == 1 else torch.cat(flat)
        if self.slot_rows is None:
            return joined
        return _GatherRows.apply(joined, self.row_slots, self.slot_rows_or_pad)

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
    if mode == "mean" and size[0] == 1 and hidden.shape[0] > 0:  # one sequence (a served text): its rows' mean
        return hidden.mean(dim=0, keepdim=True)
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


# The most sequences in one batch, however short they are: the engine's, the server's batcher's and the encode
# helpers' default. Past it a batch of very short texts gains nothing, and it bounds the per-sequence work (pooling,
# padding biases) that grows with the count rather than the tokens.
MAX_BATCH_SIZE = 512


def plan_batches(lengths: list[int] | np.ndarray, token_budget: int,
                 max_batch_size: int = MAX_BATCH_SIZE) -> list[np.ndarray]:
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


__all__ = ["AttentionGroup", "GROUP_OVERHEAD", "MAX_BATCH_SIZE", "Packing", "combine_biases", "length_groups", "padding_bias",
           "plan_batches", "pool_packed", "pool_padded"]
