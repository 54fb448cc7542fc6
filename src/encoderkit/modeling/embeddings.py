"""Token + position + segment embeddings, with ALBERT/ELECTRA's factorised size and projection."""
from __future__ import annotations


import torch
from torch import nn

from ..config import EncoderConfig


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
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.embedding_dim
        self.word = nn.Embedding(config.vocab_size, dim, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, dim)
        self.token_type = nn.Embedding(config.type_vocab_size, dim) if config.type_vocab_size > 0 else None
        self.norm = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.projection = nn.Linear(dim, config.hidden_size) if config.projects_embeddings else None
        if config.sinusoidal_pos_embds:
            with torch.no_grad():
                self.position.weight.copy_(sinusoidal_table(config.max_position_embeddings, dim))
            self.position.weight.requires_grad_(False)

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.config.family.positions_from_padding:
            return padding_position_ids(input_ids, self.config.pad_token_id)
        return torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if position_ids is None:
            position_ids = self.position_ids(input_ids)
        x = self.word(input_ids) + self.position(position_ids)
        if self.token_type is not None:
            if token_type_ids is None:
                x = x + self.token_type.weight[0]
            else:
                x = x + self.token_type(token_type_ids)
        x = self.dropout(self.norm(x))
        if self.projection is not None:
            x = self.projection(x)
        return x


def init_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: N(0, std) for matrices, zeros for biases, ones for LayerNorm scales."""
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
        elif isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)


__all__ = ["Embeddings", "init_weights", "padding_position_ids", "sinusoidal_table"]
