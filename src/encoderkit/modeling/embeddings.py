"""Token + position + segment embeddings, with ALBERT/ELECTRA's factorised size and projection."""
from __future__ import annotations


import torch
from torch import nn

from ..config import EncoderConfig
from .dropout import Dropout


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """The fixed sin/cos position table of "Attention is all you need" (DistilBERT's option)."""
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.pow(10000.0, -2.0 * (torch.arange(dim, dtype=torch.float64) // 2) / dim)
    angles = position * inv_freq
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles[:, 0::2])
    table[:, 1::2] = torch.cos(angles[:, 1::2])
    return table.float()


def padding_position_ids(input_ids: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """RoBERTa's positions: real tokens count from pad_token_id + 1, padding keeps pad_token_id."""
    real = input_ids.ne(pad_token_id).to(torch.long)
    return torch.cumsum(real, dim=1) * real + pad_token_id


class Embeddings(nn.Module):
    """Word (+ absolute position) (+ segment) embeddings, normalised; ALBERT/ELECTRA project the result to the
    hidden size after the norm, DeBERTa before it (without a bias)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.embedding_dim
        self.word = nn.Embedding(config.vocab_size, dim, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, dim) if config.absolute_positions else None
        self.token_type = nn.Embedding(config.type_vocab_size, dim) if config.type_vocab_size > 0 else None
        self.project_first = config.family.embedding_projection == "before_norm"
        self.norm = nn.LayerNorm(config.hidden_size if self.project_first else dim, eps=config.layer_norm_eps,
                                 bias=config.norm_bias) if config.family.embedding_norm else nn.Identity()
        dropout = config.embedding_dropout if config.embedding_dropout is not None else config.hidden_dropout_prob
        self.dropout = Dropout(dropout)
        self.projection = None
        if config.projects_embeddings:
            self.projection = nn.Linear(dim, config.hidden_size, bias=not self.project_first)
        if config.sinusoidal_pos_embds and self.position is not None:
            with torch.no_grad():
                self.position.weight.copy_(sinusoidal_table(config.max_position_embeddings, dim))
            self.position.weight.requires_grad_(False)

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.config.family.positions_from_padding:
            return padding_position_ids(input_ids, self.config.padding_position_id)
        return torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)

    def _plus_positions(self, x: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
        if self.position is None:
            return x
        return x + self.position(self.position_ids(input_ids) if position_ids is None else position_ids)

    def _plus_types(self, x: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        if self.token_type is None:
            return x
        if token_type_ids is None or self.token_type.num_embeddings == 1:  # one segment: whatever the tokenizer
            return x + self.token_type.weight[0]  # says (a BERT tokenizer gives a pair's second text type 1)
        return x + self.token_type(token_type_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.word(input_ids)
        if self.config.family.types_before_positions:
            x = self._plus_positions(self._plus_types(x, token_type_ids), input_ids, position_ids)
        else:
            x = self._plus_types(self._plus_positions(x, input_ids, position_ids), token_type_ids)
        if self.projection is not None and self.project_first:
            x = self.projection(x)
        x = self.dropout(self.norm(x))
        if self.projection is not None and not self.project_first:
            x = self.projection(x)
        return x


def init_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: N(0, std) for matrices, zeros for biases, ones for LayerNorm/RMSNorm scales."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.normal_(sub.weight, std=std)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.Embedding):
            if not sub.weight.requires_grad:  # fixed sinusoidal table
                continue
            nn.init.normal_(sub.weight, std=std)
            if sub.padding_idx is not None:
                with torch.no_grad():
                    sub.weight[sub.padding_idx].zero_()
        elif isinstance(sub, (nn.LayerNorm, nn.RMSNorm)):
            nn.init.ones_(sub.weight)
            if getattr(sub, "bias", None) is not None:
                nn.init.zeros_(sub.bias)


__all__ = ["Embeddings", "init_weights", "padding_position_ids", "sinusoidal_table"]
