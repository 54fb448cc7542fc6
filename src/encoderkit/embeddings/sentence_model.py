"""A trainable sentence embedder: an encoderkit encoder, a pooling and an optional L2 normalisation.

``SentenceModel`` is what the embedding losses train. Its forward takes a padded batch and returns one
vector per text with gradients; the encoder unpads the batch at entry, so padding costs no compute in the
layers. ``Embedder`` (``encoderkit.tasks.embed``) is the inference counterpart: same pooling, packed path.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..io.hub import resolve_model
from ..modeling.encoder import EncoderModel
from ..tasks.embed import POOLING_MODES, pool
from ..tokenizer import BatchEncoding, Tokenizer

FEATURE_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def batch_features(batch: BatchEncoding | Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The model inputs of a tokenised batch (a ``BatchEncoding`` or a mapping): input ids, attention mask and,
    where present, token type ids."""
    if isinstance(batch, BatchEncoding):
        return batch.model_inputs()
    if not isinstance(batch, Mapping) or "input_ids" not in batch or "attention_mask" not in batch:
        raise InputError("a batch must be a BatchEncoding or a mapping with input_ids and attention_mask, "
                         f"found {type(batch).__name__}")
    return {name: batch[name] for name in FEATURE_NAMES if batch.get(name) is not None}


def slice_features(features: Mapping[str, torch.Tensor], begin: int, end: int) -> dict[str, torch.Tensor]:
    """Rows ``begin:end`` of a padded batch, cut to the longest of those rows (no all-padding columns)."""
    mask = features["attention_mask"][begin:end]
    active = mask.bool().any(dim=0).nonzero()
    width = int(active.max()) + 1 if len(active) else mask.shape[1]
    return {name: value[begin:end, :width] for name, value in features.items()}


class SentenceModel(nn.Module):
    """Text -> one vector: ``normalize(pool(encoder(tokens)))``, trainable end to end.

    ``pooling``: one of mean, cls, max, weightedmean, mean_sqrt_len (``encoderkit.tasks.embed.pool``).
    ``normalize``: L2-normalise the pooled vectors (as a sentence-transformers ``Normalize`` module does).
    ``tokenizer`` and ``max_length`` serve ``tokenize``; the forward itself takes token ids.
    """

    def __init__(self, encoder: EncoderModel, pooling: str = "mean", normalize: bool = False, *,
                 tokenizer: Tokenizer | None = None, max_length: int | None = None) -> None:
        super().__init__()
        if not isinstance(encoder, EncoderModel):
            raise InputError(f"SentenceModel needs an encoderkit EncoderModel (load_model(path, task='base')), "
                             f"found {type(encoder).__name__}")
        if pooling not in POOLING_MODES:
            raise InputError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLING_MODES)}")
        self.encoder = encoder
        self.pooling = pooling
        self.normalize = normalize
        self.tokenizer = tokenizer
        limit = encoder.config.max_sequence_length
        if max_length is None and tokenizer is not None:
            max_length = tokenizer.model_max_length
        self.max_length = min(max_length or limit, limit)
        if self.max_length < 3:
            raise InputError(f"max_length must leave room for text between the special tokens, found {max_length}")

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, pooling: str | None = None,
                        normalize: bool | None = None, max_length: int | None = None) -> "SentenceModel":
        """An HF or sentence-transformers directory (None: the default model). The pooling, normalisation and
        maximum length of a sentence-transformers directory are used unless given; a plain HF directory
        gets mean pooling without normalisation (what ``SentenceTransformer(dir)`` builds for it)."""
        from ..modeling.models import load_model

        from ..tasks.embed import refuse_other_kinds

        resolved = resolve_model(path)
        refuse_other_kinds(resolved.root)
        encoder = load_model(resolved, task="base")
        tokenizer = Tokenizer.from_pretrained(resolved.tokenizer_dir)
        info = resolved.sentence_transformer
        return cls(encoder,
                   pooling=pooling or (info.pooling if info else "mean"),
                   normalize=normalize if normalize is not None else bool(info and info.normalize),
                   tokenizer=tokenizer,
                   max_length=max_length or (info.max_seq_length if info else None))

    @property
    def dimension(self) -> int:
        return self.encoder.config.hidden_size

    def tokenize(self, texts: Sequence[str]) -> BatchEncoding:
        """A padded batch of ``texts``, truncated to ``max_length`` tokens."""
        if self.tokenizer is None:
            raise InputError("this SentenceModel has no tokenizer; pass tokenizer= or use from_pretrained")
        if isinstance(texts, str):
            texts = [texts]
        return self.tokenizer.encode_batch(texts, max_length=self.max_length)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, length) token ids -> (batch, dimension) embeddings."""
        hidden = self.encoder(input_ids, attention_mask, token_type_ids).last_hidden_state
        vectors = pool(hidden, attention_mask, self.pooling)
        return F.normalize(vectors, p=2, dim=-1) if self.normalize else vectors

    def embed(self, batch: BatchEncoding | Mapping[str, Any]) -> torch.Tensor:
        """The embeddings of a tokenised batch (``tokenize``'s output or a mapping of the model inputs)."""
        return self(**batch_features(batch))

    def extra_repr(self) -> str:
        return f"pooling={self.pooling!r}, normalize={self.normalize}, max_length={self.max_length}"
