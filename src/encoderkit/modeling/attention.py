"""One bidirectional self-attention for every family, on the token layout of ``packing``.

The projections run on the (tokens, hidden) rows; the attention product runs on each attention group's
(count, heads, length, head_dim) grid. What differs between families is chosen by the config, in one place
(``SelfAttention.attend_grid``):

- positions: absolute (added to the embeddings, nothing here), rotary (ModernBERT: q and k rotated by their
  column, with a global and a local theta), or disentangled relative scores (DeBERTa: c2p and p2c);
- the span: full attention, or a symmetric sliding window computed block by block, so memory grows linearly
  with length (ModernBERT's local layers);
- the kernel: torch SDPA, an explicit product that also returns the probabilities (attention maps), or, training
  on the CPU, ``_TrainingAttention`` (full attention with the dropout of ``modeling.dropout``: one autograd function
  around the products, the softmax, mask and dropout in one native pass each way).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import kernels
from ..config import EncoderConfig
from ..errors import InputError
from .dropout import dropout, kernel_mask, own_masks
from .inference import InferencePlan, apply_linear, plus_product
from .packing import AttentionGroup, Packing, combine_biases
from .training_linear import linear


# SDPA's kernels on a GPU, without cuDNN's: for bf16 SDPA chooses cuDNN's attention, which plans anew for each input
# shape, and packed batches bring new shapes at nearly every step, so its host time dwarfed the kernels' (bench/gpu.py's
# fine-tuning profile, BENCHMARKS.md).
_GPU_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> torch.Tensor:
    """``F.scaled_dot_product_attention``; on a GPU with the backends of ``_GPU_SDPA_BACKENDS`` only."""
    if q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, k, v, **options)
    with sdpa_kernel(_GPU_SDPA_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, **options)


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


# ---------------------------------------------------------------------------------------------
# Position schemes
# ---------------------------------------------------------------------------------------------
class RotaryTables(nn.Module):
    """cos/sin tables of rotary position embeddings (Su et al., 2021), one per theta, grown on demand."""

    def __init__(self, head_dim: int, thetas: dict[str, float], factor: float = 1.0) -> None:
        """``factor``: linear scaling, positions divided by it (the frequencies, equivalently)."""
        super().__init__()
        self.head_dim = head_dim
        self.thetas = dict(thetas)
        self.factor = factor
        self._tables: dict[tuple[str, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, kind: str, length: int, device: torch.device, cache: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(length, head_dim / 2) fp32 cos and sin for positions 0..length-1 (each frequency once). ``cache=False``
        (tracing): computed for exactly ``length`` positions, so that a trace follows the input's length."""
        key = (kind, device)
        cached = self._tables.get(key) if cache else None
        if cached is None or cached[0].shape[0] < length:
            size = length if not cache else max(length, 2 * cached[0].shape[0] if cached is not None else 512)
            inv_freq = 1.0 / (self.thetas[kind] ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32,
                                                                 device=device) / self.head_dim))
            if self.factor != 1.0:
                inv_freq = inv_freq / self.factor
            angles = torch.arange(size, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
            cached = (angles.cos(), angles.sin())
            if cache:
                self._tables[key] = cached
        return cached[0][:length], cached[1][:length]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (..., length, head_dim) by the halves convention (the first half of the dimensions
    pairs with the second), computed in fp32; ``cos``/``sin``: (length, head_dim / 2)."""
    half = x.shape[-1] // 2
    x32 = x.float()
    first, second = x32[..., :half], x32[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1).to(x.dtype)


def relative_positions(length: int, buckets: int, max_position: int, device: torch.device) -> torch.Tensor:
    """DeBERTa's (length, length) relative positions query - key, in log buckets when ``buckets`` > 0."""
    ids = torch.arange(length, dtype=torch.long, device=device)
    relative = ids[:, None] - ids[None, :]
    if buckets <= 0 or max_position <= 0:
        return relative
    sign = torch.sign(relative)
    mid = buckets // 2
    near = (relative < mid) & (relative > -mid)
    magnitude = torch.where(near, torch.tensor(mid - 1, device=device), relative.abs())
    log_position = torch.ceil(torch.log(magnitude / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return torch.where(magnitude <= mid, relative.to(log_position.dtype), log_position * sign).long()


class RelativePositionBias(nn.Module):
    """MPNet's attention bias (Song et al., 2020, after T5's, Raffel et al., 2020): a learned value per head for each
    bucket of the relative position key - query, added to every layer's scores; computed once a forward per length.

    The buckets are T5's: half for each direction, the nearest 8 positions each their own, farther ones
    logarithmically up to 128. MPNet computes them for 32 buckets whatever the table's size
    (``relative_attention_num_buckets``): that is the model's definition, in its original code and in
    transformers', so a table of more rows has rows no position reaches."""

    BUCKETS, MAX_DISTANCE = 32, 128

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.table = nn.Embedding(config.relative_attention_num_buckets, config.num_attention_heads)

    @classmethod
    def buckets(cls, length: int, device: torch.device) -> torch.Tensor:
        """(length, length) bucket of each (query, key) pair."""
        ids = torch.arange(length, dtype=torch.long, device=device)
        return cls.bucket_of(ids[:, None] - ids[None, :])

    @classmethod
    def bucket_of(cls, distance: torch.Tensor) -> torch.Tensor:
        """The bucket of each relative position ``distance`` = query - key (positive where the key is before)."""
        half = cls.BUCKETS // 2
        exact = half // 2
        bucket = (distance < 0).long() * half
        distance = distance.abs()
        far = exact + (torch.log(distance.float() / exact) / math.log(cls.MAX_DISTANCE / exact)
                       * (half - exact)).long()
        return bucket + torch.where(distance < exact, distance, far.clamp(max=half - 1))

    def forward(self, length: int, device: torch.device) -> torch.Tensor:
        """(1, heads, length, length) additive bias."""
        return self.table(self.buckets(length, device)).permute(2, 0, 1)[None]

    def by_distance(self, span: int, pad: int = 0) -> torch.Tensor:
        """(heads, 2 * span - 1 + pad) bias of each head by query - key + span - 1 (for sequences of at most
        ``span`` tokens; ``pad`` zeros after): the same values as ``forward``, laid out for the native kernel."""
        distance = torch.arange(2 * span - 1, dtype=torch.long, device=self.table.weight.device) - (span - 1)
        rows = self.table(self.bucket_of(distance)).t()
        return torch.nn.functional.pad(rows, (0, pad)).contiguous()


@dataclass
class AttentionContext:
    """What one forward pass shares between its layers: the layout and per-length position tables."""

    packing: Packing
    return_probs: bool = False
    rotary: RotaryTables | None = None
    relative_embeddings: torch.Tensor | None = None  # (2 * span, hidden), normalised: DeBERTa
    score_parts: list[dict[str, torch.Tensor]] | None = None  # filled per layer when asked (return_probs only)
    dense: bool = False  # sliding windows as a mask over the full grid (a traced graph: no length-dependent branch)
    position_bias: RelativePositionBias | None = None  # MPNet
    plan: InferencePlan | None = None  # the encoder's inference speed-ups (``for_inference``), reached by each product
    _relative_index: dict[int, torch.Tensor] = field(default_factory=dict)
    _position_bias: dict[int, torch.Tensor] = field(default_factory=dict)
    _native_bias: list[torch.Tensor | None] = field(default_factory=list)

    def position_bias_of(self, length: int, dtype: torch.dtype) -> torch.Tensor:
        """(1, heads, length, length) MPNet bias, once a forward per length (every layer adds the same)."""
        if length not in self._position_bias:
            self._position_bias[length] = self.position_bias(length, self.packing.positions.device).to(dtype)
        return self._position_bias[length]

    def native_bias(self) -> torch.Tensor | None:
        """MPNet's bias laid out for the native attention (``kernels.native_bias_layout``) for this batch's longest
        sequence, once a forward."""
        if not self._native_bias:
            self._native_bias.append(kernels.native_bias_layout(self.position_bias, self.packing.max_length))
        return self._native_bias[0]

    def relative_index(self, length: int, config: EncoderConfig) -> torch.Tensor:
        if length not in self._relative_index:
            max_position = config.max_relative_positions if config.max_relative_positions >= 1 \
                else config.max_position_embeddings
            self._relative_index[length] = relative_positions(length, config.position_buckets, max_position,
                                                              self.packing.positions.device)
        return self._relative_index[length]


# ---------------------------------------------------------------------------------------------
# Sliding-window attention by blocks: linear memory in the length
# ---------------------------------------------------------------------------------------------
def window_mask(length: int, half: int, device: torch.device) -> torch.Tensor:
    """(length, length) bool: True where |query - key| <= half."""
    ids = torch.arange(length, device=device)
    return (ids[:, None] - ids[None, :]).abs() <= half


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None, half: int,
                    dropout_p: float, scale: float | None = None) -> torch.Tensor:
    """Attention of (count, heads, length, d) grids where a query sees keys within ``half`` positions.

    Queries are cut into blocks of ``2 * half``; each block attends to its keys and ``half`` more on each
    side, so memory is O(length * window) instead of O(length^2). The blocks go into SDPA's batch dimension
    (4-D inputs), where torch runs its fused kernel rather than the reference path."""
    count, heads, length, dim = q.shape
    block = 2 * half
    blocks = -(-length // block)
    padded = blocks * block
    span = block + 2 * half

    def by_block(x: torch.Tensor, size: int) -> torch.Tensor:  # (count, heads, blocks, size, d) -> 4-D
        return x.permute(0, 2, 1, 3, 4).reshape(count * blocks, heads, size, dim)

    q = by_block(F.pad(q, (0, 0, 0, padded - length)).view(count, heads, blocks, block, dim), block)

    def windows(x: torch.Tensor) -> torch.Tensor:  # (count * blocks, heads, span, d)
        x = F.pad(x, (0, 0, half, padded - length + half))
        return by_block(x.unfold(2, span, block).transpose(-1, -2), span)

    real = torch.ones(count, length, dtype=torch.bool, device=q.device) if key_mask is None else key_mask
    real = F.pad(real, (half, padded - length + half)).unfold(1, span, block)  # (count, blocks, span)
    band = torch.arange(block, device=q.device)[:, None] - torch.arange(span, device=q.device)[None, :] + half
    allowed = (band.abs() <= half)[None, None] & real[:, :, None, :]  # (count, blocks, block, span)
    bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed, torch.finfo(q.dtype).min)
    bias = bias.view(count * blocks, 1, block, span)
    out = sdpa(q, windows(k), windows(v), attn_mask=bias, dropout_p=dropout_p, scale=scale)
    out = out.view(count, blocks, heads, block, dim).permute(0, 2, 1, 3, 4).reshape(count, heads, padded, dim)
    return out[:, :, :length]


# ---------------------------------------------------------------------------------------------
# Training on the CPU: one group's attention in one autograd function
# ---------------------------------------------------------------------------------------------
class _TrainingAttention(torch.autograd.Function):
    """Full attention of one group's (count, length, 3 x heads x d) grid of query, key and value rows, with dropout on
    the probabilities; the output is (count, heads, length, d).

    What autograd would record as about twenty operations a layer (the head split's copies, the scale, the mask,
    softmax, dropout, the products, and each one's backward) is here: one copy of q, k and v into head-major order,
    the two products, and between them one native pass (``ek_attention_probs``: the scale, the padding mask as each
    sequence's count of real keys, softmax, and the dropout mask of ``modeling.dropout``, drawn from a seed); the
    backward pass is the four products and one native pass (``ek_attention_probs_backward``: the mask drawn again,
    softmax's gradient, the scale), the gradients written straight into one buffer in the grid's layout. The
    probabilities and their dropped copy are kept for the backward pass, as autograd keeps them."""

    @staticmethod
    def forward(ctx, grid: torch.Tensor, valid: torch.Tensor | None, heads: int, scale: float,
                mask: tuple[int, int, float]) -> torch.Tensor:
        count, length, width = grid.shape
        dim = width // (3 * heads)
        batch = count * heads
        qkv = grid.view(count, length, 3, heads, dim).permute(2, 0, 3, 1, 4).contiguous()
        q, k, v = (part.view(batch, length, dim) for part in qkv.unbind(0))
        probs = torch.bmm(q, k.transpose(1, 2))  # raw scores, overwritten with the probabilities
        seed, dropped, keep_scale = mask
        weights = torch.empty_like(probs) if dropped else probs
        kernels.library().ek_attention_probs(
            probs.data_ptr(), weights.data_ptr() if dropped else None, batch * length, length,
            None if valid is None else valid.data_ptr(), heads * length, scale, seed, dropped, keep_scale,
            torch.get_num_threads())
        ctx.save_for_backward(qkv, probs, weights)
        ctx.shape, ctx.scale, ctx.mask = (count, length, heads, dim), scale, mask
        return torch.bmm(weights, v).view(count, heads, length, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        qkv, probs, weights = ctx.saved_tensors
        count, length, heads, dim = ctx.shape
        batch = count * heads
        q, k, v = (part.view(batch, length, dim) for part in qkv.unbind(0))
        grad = grad.contiguous().view(batch, length, dim)
        grads = torch.empty_like(qkv)
        grad_q, grad_k, grad_v = (part.view(batch, length, dim) for part in grads.unbind(0))
        grad_scores = torch.bmm(grad, v.transpose(1, 2))  # of the dropped probabilities, then of the raw scores
        torch.bmm(weights.transpose(1, 2), grad, out=grad_v)
        seed, dropped, keep_scale = ctx.mask
        kernels.library().ek_attention_probs_backward(probs.data_ptr(), grad_scores.data_ptr(), batch * length,
                                                     length, ctx.scale, seed, dropped, keep_scale,
                                                     torch.get_num_threads())
        torch.bmm(grad_scores, k, out=grad_q)
        torch.bmm(grad_scores.transpose(1, 2), q, out=grad_k)
        grad_grid = grads.permute(1, 3, 0, 2, 4).reshape(count, length, 3 * heads * dim)
        return grad_grid, None, None, None, None


# ---------------------------------------------------------------------------------------------
# The module
# ---------------------------------------------------------------------------------------------
class SelfAttention(nn.Module):
    """Projections (fused Wqkv, or query/key/value as the checkpoint has them), the attention product on each
    group's grid, and the output projection."""

    def __init__(self, config: EncoderConfig, index: int = 0) -> None:
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.kv_heads = config.kv_heads  # fewer than num_heads: grouped-query attention, heads share keys/values
        hidden = config.hidden_size
        kv_width = self.kv_heads * self.head_dim
        bias = config.attention_bias
        if config.family.fused_qkv:
            self.qkv = nn.Linear(hidden, hidden + 2 * kv_width, bias=bias)
        else:
            self.query = nn.Linear(hidden, hidden, bias=bias)
            self.key = nn.Linear(hidden, kv_width, bias=bias)
            self.value = nn.Linear(hidden, kv_width, bias=bias)
        self.output = nn.Linear(hidden, hidden, bias=bias)
        self.dropout_p = config.attention_probs_dropout_prob
        self.layer_type = config.layer_type(index)
        self.window_half = config.local_attention // 2 if self.layer_type == "sliding_attention" else None
        self.rotary_kind = None if config.global_rope_theta is None else (
            "local" if self.layer_type == "sliding_attention" else "global")
        self.pos_att_type = tuple(config.pos_att_type or ()) if config.relative_attention else ()
        if self.pos_att_type and not config.share_att_key:
            if "c2p" in self.pos_att_type:
                self.pos_key = nn.Linear(hidden, hidden)
            if "p2c" in self.pos_att_type:
                self.pos_query = nn.Linear(hidden, hidden)
        # DeBERTa scales the content and each position score by sqrt(d * (1 + number of position terms)), the
        # terms counted from pos_att_type even when relative attention is off (as transformers does).
        self.scale = 1.0 / math.sqrt(self.head_dim * (1 + len(config.pos_att_type or ())))
        self.scaled = bool(config.pos_att_type)

    def project(self, x: torch.Tensor, plan: InferencePlan | None = None) -> torch.Tensor:
        """Query, key and value of each row in one matrix product: (rows, hidden + 2 * key/value width); for
        inference, the plan's pre-packed projection (three matrices fused into one where the checkpoint keeps three)."""
        if hasattr(self, "qkv"):
            return apply_linear(plan, self.qkv, x)
        fused = None if plan is None else plan.project(self, x)
        return fused if fused is not None else self.separate_projection(x)

    def separate_projection(self, x: torch.Tensor) -> torch.Tensor:
        """The product with the three separate matrices (the training path, gradients to each)."""
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = None if self.query.bias is None else torch.cat([self.query.bias, self.key.bias, self.value.bias])
        return linear(x, weight, bias)

    def forward(self, x: torch.Tensor, context: AttentionContext, residual: torch.Tensor | None = None,
                keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention output of (rows, hidden) ``x``, plus ``residual`` when given (a post-norm layer's
        residual add without dropout, run inside the output projection's kernel for inference). ``keep``: the
        output projection runs on these rows only (every row is a key and value); ``residual`` is theirs."""
        qkv = self.project(x, context.plan)
        rows, probs = self.native_attention(qkv, context), None
        if rows is None:
            rows, probs = self.attend_groups(qkv, context)
        if keep is not None:
            rows = rows.index_select(0, keep)
        if residual is None:
            return apply_linear(context.plan, self.output, rows), probs
        return plus_product(context.plan, residual, self.output, rows), probs

    def native_attention(self, qkv: torch.Tensor, context: AttentionContext) -> torch.Tensor | None:
        """The (rows, hidden) attention output of the whole batch in one native call (``kernels.native_attention``),
        for inference of plain attention, or with MPNet's bias: no gradient, no probabilities asked for, no other
        position terms (rotary, DeBERTa's), no window shorter than the batch's longest sequence, as many key/value
        heads as query heads, and nothing masked but the other sequences (packed in row order, no padding). None:
        the groups run SDPA (``attend_groups``)."""
        packing = context.packing
        if self.training or torch.is_grad_enabled() or context.return_probs or context.dense \
                or context.score_parts is not None:
            return None
        if self.rotary_kind is not None or self.pos_att_type or self.kv_heads != self.num_heads:
            return None
        longest = packing.max_length
        if self.window_half is not None and longest > self.window_half + 1:
            return None
        if not packing.by_sequence_only:
            return None
        bias = None
        if context.position_bias is not None:
            bias = context.native_bias()
            if bias is None:
                return None
        return kernels.native_attention(qkv, packing.cu_seqlens, self.num_heads, self.scale_or_default, longest,
                                        bias)

    def attend_groups(self, qkv: torch.Tensor, context: AttentionContext
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The (rows, hidden) attention output, group by group (SDPA, or the products where probabilities are asked
        for or training draws its own dropout masks), and the last group's probabilities when asked for."""
        packing = context.packing
        hidden = self.num_heads * self.head_dim
        # Runs of equal-length sequences in row order (the engine's sorted batches) write their outputs in place;
        # a single run (one sequence, or all of one length) takes SDPA's (count, length, heads, d) output as is.
        in_place = packing.in_row_order
        single = in_place and len(packing.groups) == 1
        rows = qkv.new_empty(qkv.shape[0], hidden) if in_place and not single else None
        outputs, probs = [], None
        for group, grid in zip(packing.groups, packing.to_grids(qkv)):
            mask = self.training_attention(grid, group, context)
            if mask is not None:
                out = _TrainingAttention.apply(grid, group.valid, self.num_heads, self.scale_or_default, mask)
            else:
                q, k, v = self.split_heads(grid, group.count, group.length)
                out, probs = self.attend_grid(q, k, v, group, context)
            out = out.transpose(1, 2)
            if single:
                rows = out.reshape(group.slots, hidden)  # a view: SDPA writes its output in this layout
            elif in_place:
                rows[group.start:group.start + group.slots].view(group.count, group.length, self.num_heads,
                                                                 self.head_dim).copy_(out)
            else:
                outputs.append(out.reshape(group.count, group.length, hidden))
        if not in_place:
            rows = packing.from_grids(outputs) if outputs else qkv.new_zeros(0, hidden)
        return rows, probs

    def split_heads(self, grid: torch.Tensor, count: int, length: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query, key and value of a (count, length, width) grid, each (count, heads, length, head_dim). With
        grouped-query attention, each key/value head serves ``num_heads // kv_heads`` consecutive query heads."""
        heads, dim = self.num_heads, self.head_dim
        if self.kv_heads == heads:
            return grid.view(count, length, 3, heads, dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k, v = grid.split([heads * dim, self.kv_heads * dim, self.kv_heads * dim], dim=-1)
        q = q.reshape(count, length, heads, dim).transpose(1, 2)
        shared = heads // self.kv_heads

        def spread(x: torch.Tensor) -> torch.Tensor:  # (count, kv_heads, length, dim) -> one copy per query head
            x = x.reshape(count, length, self.kv_heads, dim).transpose(1, 2)
            return x[:, :, None].expand(count, self.kv_heads, shared, length, dim).reshape(count, heads, length, dim)

        return q, spread(k), spread(v)

    @property
    def scale_or_default(self) -> float:
        return self.scale if self.scaled else 1.0 / math.sqrt(self.head_dim)

    def training_attention(self, grid: torch.Tensor, group: AttentionGroup,
                           context: AttentionContext) -> tuple[int, int, float] | None:
        """The dropout mask (seed, dropped count, scale of kept elements; see ``modeling.dropout``) where this group's
        attention runs as ``_TrainingAttention``: training on the CPU in fp32 with the native library, full attention
        with no position terms (not rotary, not DeBERTa's, no window over this length), no mask but the padding of
        each sequence's last keys, no probabilities asked for. None: the general path below."""
        if not (self.training and torch.is_grad_enabled() and grid.device.type == "cpu"
                and grid.dtype == torch.float32):
            return None
        if (self.rotary_kind is not None or self.pos_att_type or context.return_probs or context.dense
                or context.position_bias is not None or self.kv_heads != self.num_heads):
            return None
        if self.window_half is not None and group.length > self.window_half + 1:
            return None
        if group.bias is not None and group.valid is None:
            return None
        return kernel_mask(self.dropout_p, grid.device)

    def attend_grid(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: AttentionGroup,
                    context: AttentionContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(count, heads, length, head_dim) attention output of one group, and its probabilities if asked for."""
        length = group.length
        dropout_p = self.dropout_p if self.training else 0.0
        if self.rotary_kind is not None:
            cos, sin = context.rotary.get(self.rotary_kind, length, q.device, cache=not context.dense)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        bias, scale = group.bias, (self.scale if self.scaled else None)
        parts: dict[str, torch.Tensor] = {}
        if self.pos_att_type:
            parts = self.relative_scores(q, k, length, context)
            bias = combine_biases(sum(parts.values()), bias)
        if context.position_bias is not None:
            bias = combine_biases(context.position_bias_of(length, q.dtype), bias)
        if bias is not None and bias.dtype not in (q.dtype, torch.bool):
            bias = bias.to(q.dtype)
        windowed = self.window_half is not None and (context.dense or length > self.window_half + 1)
        if windowed and not (context.return_probs or context.dense):
            return local_attention(q, k, v, group.key_mask, self.window_half, dropout_p, scale), None
        if windowed:  # attention maps, tracing: the window as a mask over the full grid
            outside = ~window_mask(length, self.window_half, q.device)
            bias = combine_biases(bias if bias is not None else q.new_zeros(1, 1, length, length),
                                  q.new_zeros(length, length).masked_fill(outside, torch.finfo(q.dtype).min))
        # Training where ``dropout`` draws its own masks (the CPU): the products below with them (SDPA would take
        # the same steps, drawing its mask with torch's slower generator).
        if not context.return_probs and not own_masks(q.device, dropout_p):
            return sdpa(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale), None
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale_or_default
        if context.score_parts is not None:  # the content and position terms of the scores, before the mask
            context.score_parts.append({"c2c": scores, **parts})
        if bias is not None:
            scores = scores + bias
        probs = scores.softmax(dim=-1)
        return torch.matmul(dropout(probs, dropout_p, self.training), v), probs

    def relative_scores(self, q: torch.Tensor, k: torch.Tensor, length: int,
                        context: AttentionContext) -> dict[str, torch.Tensor]:
        """DeBERTa's content-to-position ("c2p") and position-to-content ("p2c") scores, already scaled: each
        (count, heads, L, L)."""
        config = self.config
        span = config.relative_span
        embeddings = dropout(context.relative_embeddings[:2 * span], self.config.hidden_dropout_prob, self.training)
        relative = context.relative_index(length, config)
        heads, dim = self.num_heads, self.head_dim

        def by_head(projection: nn.Linear) -> torch.Tensor:  # (heads, 2 * span, head_dim)
            return apply_linear(context.plan, projection, embeddings).view(-1, heads, dim).transpose(0, 1)

        parts = {}
        if "c2p" in self.pos_att_type:
            pos_key = by_head(self.key if config.share_att_key else self.pos_key)
            c2p = torch.matmul(q, pos_key.transpose(-1, -2))  # (count, heads, L, 2 * span)
            index = (relative + span).clamp(0, 2 * span - 1)
            c2p = torch.gather(c2p, -1, index.expand(*c2p.shape[:2], length, length))
            parts["c2p"] = c2p * self.scale
        if "p2c" in self.pos_att_type:
            pos_query = by_head(self.query if config.share_att_key else self.pos_query)
            p2c = torch.matmul(k, pos_query.transpose(-1, -2))  # (count, heads, L keys, 2 * span)
            index = (span - relative).clamp(0, 2 * span - 1)
            p2c = torch.gather(p2c, -1, index.expand(*p2c.shape[:2], length, length)).transpose(-1, -2)
            parts["p2c"] = p2c * self.scale
        return parts


__all__ = ["AttentionContext", "RelativePositionBias", "RotaryTables", "SelfAttention", "causal_bias", "check_attention_bias",
           "local_attention", "relative_positions", "rotate", "window_mask"]
