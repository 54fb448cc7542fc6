"""The encoder: embeddings, post-norm transformer layers (optionally shared, ALBERT-style) and a pooler."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig
from .attention import SelfAttention, Unpadding, check_attention_bias, combine_biases, padding_bias
from .embeddings import Embeddings


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


class EncoderLayer(nn.Module):
    """One post-norm block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = Activation(config.hidden_act)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, x: torch.Tensor, bias: torch.Tensor | None, return_probs: bool = False,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, probs = self.attention(x, bias, return_probs, unpadding)
        x = self.attention_norm(x + self.dropout(attended))
        x = self.ffn_norm(x + self.dropout(self.ffn_out(self.activation(self.ffn_in(x)))))
        return x, probs


class Pooler(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class EncoderModel(nn.Module):
    """The base encoder of every family: what ``BertModel``/``RobertaModel``/... are in transformers."""

    def __init__(self, config: EncoderConfig, add_pooler: bool | None = None) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_unique_layers))
        if add_pooler is None:
            add_pooler = config.family.has_pooler
        self.pooler = Pooler(config) if add_pooler else None

    def layer_schedule(self) -> list[int]:
        """Which unique layer runs at each depth (identity without sharing; ALBERT repeats its groups)."""
        config = self.config
        per_group = config.num_hidden_layers / config.num_groups
        order = []
        for depth in range(config.num_hidden_layers):
            group = int(depth / per_group)
            order.extend(group * config.inner_group_num + j for j in range(config.inner_group_num))
        return order

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
    ) -> EncoderOutput:
        """``attention_bias``: an optional additive mask of shape (batch or 1, heads or 1, queries, keys), added
        to the padding mask in every layer (e.g. ``attention.causal_bias`` for a left-to-right mask)."""
        unpadding = None
        if (attention_mask is not None and attention_bias is None and not output_attentions
                and _worth_unpadding(attention_mask)):
            # Unpad once here, run every layer's dense products on real tokens only, re-pad once at the end.
            unpadding = Unpadding.from_mask(attention_mask, self.embeddings.word.weight.dtype)
            if position_ids is None:
                position_ids = self.embeddings.position_ids(input_ids)
            token_type_ids = None if token_type_ids is None else unpadding.unpad(token_type_ids)
            input_ids, position_ids = unpadding.unpad(input_ids), unpadding.unpad(position_ids)
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        bias = None if unpadding is not None else padding_bias(attention_mask, x.dtype)
        if attention_bias is not None:
            check_attention_bias(attention_bias, *input_ids.shape, self.config.num_attention_heads)
            bias = combine_biases(bias, attention_bias.to(x.dtype))
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for index in self.layer_schedule():
            x, probs = self.layers[index](x, bias, output_attentions, unpadding)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        if unpadding is not None:
            x = unpadding.pad(x)
            if hidden_states is not None:
                hidden_states = [unpadding.pad(h) for h in hidden_states]
        return EncoderOutput(
            last_hidden_state=x,
            pooler_output=self.pooler(x) if self.pooler is not None else None,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
        )


UNPAD_MIN_PADDING = 0.1  # below this share of padding, re-padding in every layer costs about what it saves


def _worth_unpadding(attention_mask: torch.Tensor) -> bool:
    """True when at least ``UNPAD_MIN_PADDING`` of the batch's positions are padding."""
    return attention_mask.dim() == 2 and float(attention_mask.float().mean()) <= 1.0 - UNPAD_MIN_PADDING
