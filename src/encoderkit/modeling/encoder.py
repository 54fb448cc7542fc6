"""The encoder of every family: embeddings, transformer layers (post- or pre-norm, optionally shared ALBERT-style),
and a pooler or a final norm where the family has one.

There is one forward: ``EncoderModel.run`` on a (tokens, hidden) matrix laid out by a ``Packing``. Training
and evaluation enter through ``forward`` (a padded batch, unpadded once at entry and re-padded once at exit);
the inference engine enters through ``forward_packed`` (sequences packed back to back, never padded). Speed-ups
for inference (pre-packed linear layers, bf16 matrix products) are applied to this same model in place by
``modeling.inference.for_inference``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig
from ..errors import InputError
from .kernels import native_forward
from .attention import AttentionContext, RelativePositionBias, RotaryTables, SelfAttention, check_attention_bias
from .dropout import Dropout, add_norm
from .embeddings import Embeddings
from .inference import InferencePlan, apply_linear, fused_product, plus_product
from .packing import Packing


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_fast(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


_ACTIVATIONS = {
    "gelu": F.gelu,  # exact (erf) GELU, as BERT's "gelu"
    "gelu_new": _gelu_new,  # the tanh approximation, written out as ALBERT/GPT-2 compute it
    "gelu_fast": _gelu_fast,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


class Activation(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.fn = _ACTIVATIONS[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return self.name


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (batch, length, hidden)
    pooler_output: torch.Tensor | None = None  # (batch, hidden): tanh(dense([CLS])) where the family has one
    hidden_states: tuple[torch.Tensor, ...] | None = None  # embeddings output, then each layer's output
    attentions: tuple[torch.Tensor, ...] | None = None  # each layer's (batch, heads, length, length) probabilities
    # DeBERTa: each layer's score terms before the mask and softmax, {"c2c", "c2p", "p2c"}: (batch, heads, L, L)
    score_parts: tuple[dict[str, torch.Tensor], ...] | None = None


class RMSNorm(nn.RMSNorm):
    """Root-mean-square norm (Zhang and Sennrich, 2019), x / rms(x) * scale, computed in fp32: torch's module with
    its forward written out in elementary operations, which every ONNX opset exports (``aten::rms_norm`` has none
    at opset 17)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def layer_norm(config: EncoderConfig, size: int | None = None) -> nn.Module:
    """The family's norm: LayerNorm, or RMSNorm (EuroBERT: a scale and no bias)."""
    if config.family.norm == "rms":
        return RMSNorm(size or config.hidden_size, eps=config.layer_norm_eps)
    return nn.LayerNorm(size or config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias)


class EncoderLayer(nn.Module):
    """One block. Post-norm (BERT, DeBERTa, NomicBERT, GTE): x = LN(x + Attn(x)); x = LN(x + MLP(x)).
    Pre-norm (ModernBERT, EuroBERT): x = x + Attn(LN(x)); x = x + MLP(LN(x)). The MLP is act(W1 x) or, gated,
    act(a) * b with [a, b] = W1 x (or act(b) * a, as the family's checkpoints order the halves)."""

    def __init__(self, config: EncoderConfig, index: int = 0) -> None:
        super().__init__()
        self.pre_norm = config.is_pre_norm
        self.attention = SelfAttention(config, index)
        first_without_norm = self.pre_norm and index == 0 and not config.family.first_layer_attention_norm
        self.attention_norm = nn.Identity() if first_without_norm else layer_norm(config)
        self.glu = config.family.mlp == "glu"
        self.gate_second = config.family.glu_activated_half == "second"
        width = config.intermediate_size * (2 if self.glu else 1)
        self.ffn_in = nn.Linear(config.hidden_size, width, bias=config.mlp_bias and config.family.ffn_in_bias)
        self.activation = Activation(config.hidden_act)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.ffn_norm = layer_norm(config)
        if self.pre_norm:  # ModernBERT: dropout on the attention output and inside the MLP, none on the residual
            self.attention_dropout = Dropout(config.attention_probs_dropout_prob)
            self.inner_dropout = Dropout(config.mlp_dropout or 0.0)
            self.output_dropout = nn.Identity()
        else:
            self.attention_dropout = self.output_dropout = Dropout(config.hidden_dropout_prob)
            self.inner_dropout = Dropout(config.hidden_dropout_prob) if config.family.mlp_inner_dropout \
                else nn.Identity()

    def inner(self, x: torch.Tensor, plan: InferencePlan | None = None) -> torch.Tensor:
        """The MLP's hidden states of ``x``, after its activation (and inner dropout). For inference (``plan``, made
        by ``for_inference``) the activation runs inside the product's kernel where it can (``fused_product``)."""
        inner = None if self.glu else fused_product(plan, self.ffn_in, x, activation=self.activation.name)
        if inner is None:
            inner = apply_linear(plan, self.ffn_in, x)
            if self.glu:
                value, gate = inner.chunk(2, dim=-1)
                if self.gate_second:
                    value, gate = gate, value
                inner = self.activation(value) * gate
            else:
                inner = self.activation(inner)
        return self.inner_dropout(inner)

    def mlp(self, x: torch.Tensor, residual: torch.Tensor, plan: InferencePlan | None = None) -> torch.Tensor:
        """``residual`` + the MLP of ``x`` (the residual add inside the product's kernel for inference, where it can)."""
        return plus_product(plan, residual, self.ffn_out, self.inner(x, plan), self.output_dropout)

    def forward(self, x: torch.Tensor, context: AttentionContext, keep: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer on (rows, hidden) ``x``. ``keep``: only these rows' outputs are wanted. Every row is still a
        key and value of the attention; from the attention's output projection on, only these rows are computed."""
        if self.pre_norm:
            attended, probs = self.attention(self.attention_norm(x), context, keep=keep)
            x = x if keep is None else x.index_select(0, keep)
            x = x + self.attention_dropout(attended).to(x.dtype)
            return self.mlp(self.ffn_norm(x), x, context.plan), probs
        # Without dropout the attention adds its input itself (into its output projection's kernel if it can).
        residual = x if keep is None else x.index_select(0, keep)
        attended, probs = self.attention(x, context, residual=None if self.training else residual, keep=keep)
        if self.training:  # LayerNorm(residual + dropout(...)): one native pass each way where it can
            x = add_norm(residual, attended, self.attention_dropout, self.attention_norm)
            return add_norm(x, apply_linear(context.plan, self.ffn_out, self.inner(x, context.plan)),
                            self.output_dropout, self.ffn_norm), probs
        x = self.attention_norm(attended)
        return self.ffn_norm(self.mlp(x, x, context.plan)), probs


class Pooler(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(sequences, hidden) [CLS] states -> tanh(dense(...))."""
        return torch.tanh(self.dense(hidden))


class RelativeEmbeddings(nn.Module):
    """DeBERTa's relative position embeddings, shared by every layer (normalised when norm_rel_ebd says so).
    transformers keeps the norm even without relative attention (unused then), so checkpoints carry it."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(2 * config.relative_span, config.hidden_size) \
            if config.relative_attention else None
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) \
            if config.norm_rel_ebd == "layer_norm" else None

    def forward(self) -> torch.Tensor | None:
        if self.embeddings is None:
            return None
        weight = self.embeddings.weight
        return self.norm(weight) if self.norm is not None else weight


class ConvBeside(nn.Module):
    """DeBERTa's optional convolution over the embeddings, added to the first layer's output: n-gram
    information. It runs within each sequence (zeros beyond its ends), group by group."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        size = config.conv_kernel_size
        self.conv = nn.Conv1d(config.hidden_size, config.hidden_size, size, padding=(size - 1) // 2,
                              groups=config.conv_groups)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.activation = Activation(config.conv_act)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, embedded: torch.Tensor, layer_output: torch.Tensor, packing: Packing) -> torch.Tensor:
        outputs = []
        for group, grid in zip(packing.groups, packing.to_grids(embedded)):
            grid = packing.zero_padding(grid, group)  # (count, length, hidden)
            outputs.append(packing.zero_padding(self.conv(grid.transpose(1, 2)).transpose(1, 2), group))
        out = self.activation(self.dropout(packing.from_grids(outputs)))
        return self.norm(layer_output + out)


class EncoderModel(nn.Module):
    """The base encoder of every family: what ``BertModel``/``ModernBertModel``/... are in transformers.

    ``traceable`` (a switch, off by default; ``export.export_onnx`` turns it on while tracing): ``forward`` runs
    every batch as one padded grid with an additive padding mask, and sliding-window layers mask the full grid, so
    that no shape or branch depends on the values of the input; a trace then holds for every batch size and length."""

    traceable: bool = False
    inference_plan: InferencePlan | None = None  # made by ``for_inference``: its products and native layout

    def __init__(self, config: EncoderConfig, add_pooler: bool | None = None) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.num_unique_layers))
        if add_pooler is None:
            add_pooler = config.family.has_pooler
        self.pooler = Pooler(config) if add_pooler else None
        self.final_norm = layer_norm(config) if config.family.final_norm else None
        self.relative = RelativeEmbeddings(config) \
            if config.relative_attention or config.norm_rel_ebd == "layer_norm" else None
        self.conv = ConvBeside(config) if config.conv_kernel_size > 0 else None
        self.position_bias = RelativePositionBias(config) if config.family.position_bias else None
        self.rotary = None
        if config.global_rope_theta is not None:
            self.rotary = RotaryTables(config.head_dim, {"global": config.global_rope_theta,
                                                          "local": config.local_rope_theta},
                                       factor=config.rope_factor if config.rope_type == "linear" else 1.0)

    def _apply(self, fn, recurse: bool = True):
        """``Module._apply`` (what ``to``, ``half``, ``float`` and ``cuda`` run), then the inference plan's packed
        copies made again at their next call: those methods give parameters new data by ``.data =``, which keeps
        their version counters, so the copies' own check would not see it."""
        out = super()._apply(fn, recurse)
        if self.inference_plan is not None:
            self.inference_plan.forget_packs()
        return out

    def layer_schedule(self) -> list[int]:
        """Which unique layer runs at each depth (identity without sharing; ALBERT repeats its groups)."""
        config = self.config
        per_group = config.num_hidden_layers / config.num_groups
        order = []
        for depth in range(config.num_hidden_layers):
            group = int(depth / per_group)
            order.extend(group * config.inner_group_num + j for j in range(config.inner_group_num))
        return order

    def check_length(self, length: int) -> None:
        limit = self.config.max_sequence_length
        if length > limit:
            raise InputError(f"an input of {length} tokens is longer than this {self.config.model_type} model's "
                             f"limit of {limit} (max_position_embeddings); truncate it (max_length={limit}) or "
                             "split it into windows")

    def run(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None,
            packing: Packing, output_hidden_states: bool = False, output_attentions: bool = False,
            score_parts: list[dict[str, torch.Tensor]] | None = None, keep: torch.Tensor | None = None,
            ) -> tuple[torch.Tensor, list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """The one forward of every family, on (tokens,) ids laid out by ``packing``: the final (tokens, hidden)
        states, and each layer's states and attention probabilities when asked for. ``keep`` (not with hidden
        states): only these rows' final states are wanted, and returned, (len(keep), hidden); the last layer
        computes only them past its attention (a classifier on [CLS] needs one row a sequence)."""
        if keep is not None and output_hidden_states:
            raise InputError("keep= returns some rows' final states; it cannot return every layer's states too")
        if not (output_hidden_states or output_attentions or score_parts is not None):
            # few tokens, fp32 or bf16 inference of a post-norm family: the whole forward in one native fp32 call
            # (``encoderkit.native``; a kernel switch, the same layers)
            native = native_forward(self, input_ids, token_type_ids, position_ids, packing)
            if native is not None:
                return (native if keep is None else native.index_select(0, keep)), None, None
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        context = AttentionContext(packing, output_attentions, self.rotary,
                                   None if self.relative is None else self.relative(), score_parts,
                                   dense=self.traceable, position_bias=self.position_bias, plan=self.inference_plan)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        embedded = x
        schedule = self.layer_schedule()
        # DeBERTa's convolution adds to the first layer's output at every row: then the rows are chosen after it
        last_keep = keep if keep is not None and not (len(schedule) == 1 and self.conv is not None) else None
        for depth, index in enumerate(schedule):
            x, probs = self.layers[index](x, context, keep=last_keep if depth == len(schedule) - 1 else None)
            if depth == 0 and self.conv is not None:
                x = self.conv(embedded, x, packing)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        if keep is not None and last_keep is None:
            x = x.index_select(0, keep)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if hidden_states is not None:
                hidden_states[-1] = x  # transformers reports the normalised states as the last layer's
        return x, hidden_states, attentions

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        *,
        attention_bias: torch.Tensor | None = None,
        output_score_parts: bool = False,
        first_only: bool = False,
    ) -> EncoderOutput:
        """A padded (batch, length) batch. ``attention_bias``: an optional additive mask of shape (batch or 1,
        heads or 1, queries, keys), added to the padding mask in every layer (e.g. ``attention.causal_bias``).
        ``output_score_parts`` (with ``output_attentions``): each layer's score terms, c2c and, for DeBERTa,
        c2p and p2c. ``first_only``: the caller reads position 0 alone (a classifier on [CLS]): where the batch is
        padded on the right and no layer's states are asked for, ``last_hidden_state`` is (batch, 1, hidden), and
        the last layer computes one row a sequence past its attention."""
        batch, length = input_ids.shape
        self.check_length(length)
        dtype = self.embeddings.word.weight.dtype
        if attention_bias is not None:
            check_attention_bias(attention_bias, batch, length, self.config.num_attention_heads)
            attention_bias = attention_bias.to(dtype)
        if (attention_mask is not None and attention_bias is None and not output_attentions
                and not self.traceable and _worth_unpadding(attention_mask)):
            # Unpad once here, run every layer on real tokens only, re-pad once at the end.
            packing = Packing.from_mask(attention_mask, dtype)
        else:
            packing = Packing.padded_grid(attention_mask, batch, length, dtype, attention_bias, input_ids.device,
                                          traceable=self.traceable)
        if position_ids is None and self.embeddings.position is not None:
            position_ids = self.embeddings.position_ids(input_ids)
        rows = [None if t is None else packing.unpad(t) for t in (input_ids, token_type_ids, position_ids)]
        parts: list[dict[str, torch.Tensor]] | None = [] if output_score_parts and output_attentions else None
        first_rows = packing.cu_seqlens[:-1] if (
            first_only and not output_hidden_states and not self.traceable
            and (attention_mask is None or bool(attention_mask[:, 0].all()))) else None
        x, hidden_states, attentions = self.run(*rows, packing, output_hidden_states, output_attentions, parts,
                                                keep=first_rows)
        x = packing.pad(x) if first_rows is None else x[:, None]
        if hidden_states is not None:
            hidden_states = [packing.pad(h) for h in hidden_states]
        return EncoderOutput(
            last_hidden_state=x,
            pooler_output=self.pooler(x[:, 0]) if self.pooler is not None else None,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
            score_parts=tuple(parts) if parts is not None else None,
        )

    def forward_packed(self, input_ids: torch.Tensor, packing: Packing,
                       token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Sequences packed back to back: (tokens,) ids -> (tokens, hidden) final states."""
        self.check_length(packing.max_length)
        position_ids = None
        if self.embeddings.position is not None:
            position_ids = packing.positions
            if self.config.family.positions_from_padding:
                position_ids = position_ids + self.config.padding_position_id + 1
        return self.run(input_ids, token_type_ids, position_ids, packing)[0]


UNPAD_MIN_PADDING = 0.1  # below this share of padding, re-padding in every layer costs about what it saves


def _worth_unpadding(attention_mask: torch.Tensor) -> bool:
    """True when at least ``UNPAD_MIN_PADDING`` of the batch's positions are padding."""
    return attention_mask.dim() == 2 and float(attention_mask.float().mean()) <= 1.0 - UNPAD_MIN_PADDING
