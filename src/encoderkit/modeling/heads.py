"""Task heads. One class per kind of output; the family decides the small differences (switches)."""
from __future__ import annotations

import torch
from torch import nn

from ..config import EncoderConfig
from .encoder import Activation


class MaskedLMHead(nn.Module):
    """dense -> activation -> LayerNorm -> decoder tied to the word embeddings (+ its own bias)."""

    def __init__(self, config: EncoderConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        dim = config.embedding_dim
        self.transform = nn.Linear(config.hidden_size, dim)
        self.activation = Activation(config.family.mlm_activation or config.hidden_act)
        self.norm = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(dim, config.vocab_size)
        if config.tie_word_embeddings:
            self.decoder.weight = word_embeddings.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.activation(self.transform(hidden))))


class SequenceClassificationHead(nn.Module):
    """BERT/ALBERT: pooled output -> linear. RoBERTa/ELECTRA/DistilBERT: [CLS] -> dense -> act -> linear."""

    def __init__(self, config: EncoderConfig, num_labels: int) -> None:
        super().__init__()
        style = config.family.classifier
        self.uses_pooler = style == "pooled"
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        # RoBERTa and ELECTRA drop out before their dense layer too; DistilBERT does not.
        self.dropout_first = style in ("dense_tanh", "dense_gelu")
        if self.uses_pooler:
            self.dense = None
            self.activation = None
        else:
            self.dense = nn.Linear(config.hidden_size, config.hidden_size)
            self.activation = Activation({"dense_tanh": "tanh", "dense_gelu": "gelu", "dense_relu": "relu"}[style])
        self.out = nn.Linear(config.hidden_size, num_labels)

    def forward(self, last_hidden: torch.Tensor, pooled: torch.Tensor | None) -> torch.Tensor:
        if self.dense is None:
            return self.out(self.dropout(pooled))
        x = last_hidden[:, 0]
        if self.dropout_first:
            x = self.dropout(x)
        x = self.activation(self.dense(x))
        return self.out(self.dropout(x))


class TokenClassificationHead(nn.Module):
    def __init__(self, config: EncoderConfig, num_labels: int) -> None:
        super().__init__()
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        if config.model_type == "distilbert":
            p = config.hidden_dropout_prob  # DistilBERT uses its general dropout here
        self.dropout = nn.Dropout(p)
        self.out = nn.Linear(config.hidden_size, num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(hidden))


class SpanHead(nn.Module):
    """Extractive QA: a start and an end logit per token."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.out = nn.Linear(config.hidden_size, 2)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.out(hidden).unbind(dim=-1)
        return start.contiguous(), end.contiguous()


class ReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator: one logit per token, "this token was replaced"."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = Activation(config.hidden_act)
        self.prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.prediction(self.activation(self.dense(hidden))).squeeze(-1)
