"""Task heads. One class per kind of output; the family decides the small differences (switches)."""
from __future__ import annotations

import torch
from torch import nn

from ..config import EncoderConfig
from .dropout import Dropout
from .encoder import Activation, layer_norm
from .packing import pool_padded


class MaskedLMHead(nn.Module):
    """dense -> activation -> LayerNorm -> decoder tied to the word embeddings (+ its own bias); EuroBERT's is the
    decoder alone."""

    def __init__(self, config: EncoderConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        dim = config.embedding_dim
        if config.family.mlm_transform:
            self.transform = nn.Linear(config.hidden_size, dim, bias=config.classifier_bias or
                                       config.family.classifier != "prediction_head")
            self.activation = Activation(config.head_activation)
            self.norm = layer_norm(config, dim)
        else:
            self.transform = self.activation = self.norm = nn.Identity()
        self.decoder = nn.Linear(dim, config.vocab_size, bias=config.decoder_bias)
        if config.tie_word_embeddings:
            self.decoder.weight = word_embeddings.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.activation(self.transform(hidden))))


def _dropout(config: EncoderConfig) -> float:
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


class _PredictionTransform(nn.Module):
    """ModernBERT's prediction head before a task's output layer: dense -> activation -> norm (or nothing)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.enabled = config.family.token_head_transform
        if self.enabled:
            self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
            self.activation = Activation(config.head_activation)
            self.norm = layer_norm(config)

    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(self.activation(self.dense(hidden))) if self.enabled else hidden


class SequenceClassificationHead(_PredictionTransform):
    """From the sequence's summary ([CLS], or the mean of its tokens where the config says so) to labels.

    BERT/ALBERT: pooled output -> linear. RoBERTa/ELECTRA/DistilBERT: [CLS] -> dense -> act -> linear.
    DeBERTa: [CLS] -> dense -> pooler_hidden_act -> linear. ModernBERT: summary -> dense -> act -> norm -> linear."""

    def __init__(self, config: EncoderConfig, num_labels: int) -> None:
        super().__init__(config)
        style = config.family.classifier
        self.uses_pooler = style == "pooled"
        # the summary the classifier reads: ModernBERT's and EuroBERT's config.json choose it ("bos" is [CLS]; "late":
        # every token's logits, averaged, see ``from_states``), the other families read [CLS]
        chosen = style == "prediction_head" or "classifier_pooling" in config.family.own_fields
        self.pooling = {"bos": "cls"}.get(config.classifier_pooling, config.classifier_pooling) if chosen else "cls"
        self.dropout = Dropout(_dropout(config))
        # RoBERTa, ELECTRA and DeBERTa drop out before their dense layer too; DistilBERT does not.
        self.dropout_first = None
        if not self.enabled:
            self.dense = self.activation = None
        if style in ("dense_tanh", "dense_gelu", "dense_relu", "context_pooler"):
            first = {"dense_tanh": _dropout(config), "dense_gelu": _dropout(config),
                     "context_pooler": config.pooler_dropout or 0.0}.get(style)
            self.dropout_first = Dropout(first) if first is not None else None
            self.dense = nn.Linear(config.hidden_size, config.hidden_size)
            self.activation = Activation({"dense_tanh": "tanh", "dense_gelu": "gelu", "dense_relu": "relu",
                                          "context_pooler": config.pooler_hidden_act or "gelu"}[style])
        self.out = nn.Linear(config.hidden_size, num_labels)

    def from_states(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
                    pooled: torch.Tensor | None) -> torch.Tensor:
        """(batch, labels) logits of padded (batch, length, hidden) final states: of their summary, or, pooling
        "late", the mean over each sequence's real tokens of every token's logits."""
        if self.pooling != "late":
            return self(pool_padded(hidden, attention_mask, self.pooling), pooled)
        logits = self(hidden, pooled)
        if attention_mask is None:
            return logits.mean(dim=1)
        mask = attention_mask.unsqueeze(-1).to(logits.dtype)
        return (logits * mask).sum(dim=1) / mask.sum(dim=1)

    def forward(self, summary: torch.Tensor, pooled: torch.Tensor | None) -> torch.Tensor:
        """``summary``: (batch, hidden), the [CLS] states (or the token means); ``pooled``: the pooler's output."""
        if self.uses_pooler:
            return self.out(self.dropout(pooled))
        x = summary
        if self.enabled:
            x = self.transform(x)
        else:
            if self.dropout_first is not None:
                x = self.dropout_first(x)
            x = self.activation(self.dense(x))
        return self.out(self.dropout(x))


class TokenClassificationHead(_PredictionTransform):
    def __init__(self, config: EncoderConfig, num_labels: int) -> None:
        super().__init__(config)
        p = _dropout(config)
        if config.model_type == "distilbert":
            p = config.hidden_dropout_prob  # DistilBERT uses its general dropout here
        self.dropout = Dropout(p)
        self.out = nn.Linear(config.hidden_size, num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(self.transform(hidden)))


class SpanHead(_PredictionTransform):
    """Extractive QA: a start and an end logit per token."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.dropout = Dropout(_dropout(config)) if self.enabled else nn.Identity()
        self.out = nn.Linear(config.hidden_size, 2)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.out(self.dropout(self.transform(hidden))).unbind(dim=-1)
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
