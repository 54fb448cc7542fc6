"""Learned sparse vectors (SPLADE; Formal et al., 2021, "SPLADE v2", arXiv:2109.10086): a text becomes one weight
per vocabulary term, most of them zero, from the model's masked-language-model head.

    w_t = pool_i  log(1 + ReLU(logit_{i,t}))        (pool: max over the text's tokens i, or their sum)

"log1p_relu" applies log(1 + x) once more (OpenSearch's variant). The weights expand the text with terms it does not
contain (its MLM head predicts them), so a sparse index matches documents a keyword search would miss, while the
index stays an inverted one.

``SparseEmbedder`` runs the encoder on the engine (packed batches, int8 where asked, the native kernel for short
batches) and the MLM head's vocabulary projection in chunks of tokens, so that a batch's (tokens x vocabulary)
logits never exist at once. ``SparseModel`` is the trainable counterpart, for ``SpladeLoss``. Both read and write
sentence-transformers' SparseEncoder directory (MLMTransformer + SpladePooling) and equal ``SparseEncoder.encode``
(tests/embeddings/test_sparse.py).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import CheckpointError, InputError
from ..io.hub import resolve_model
from ..modeling.packing import MAX_BATCH_SIZE
from ..tokenizer import BatchEncoding, Tokenizer
from .sparse_vectors import SparseVectors, check_max_active_dims

# index_reduce_ (a per-sequence max over packed tokens without a (tokens x vocabulary) index tensor) works as
# documented; torch marks it beta and would say so at every batch.
warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta", category=UserWarning)

SPLADE_POOLING = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
# Tokens whose vocabulary logits exist at once: (tokens x 30,522 fp32) is 125 MB at this size.
LOGIT_CHUNK_TOKENS = 1024
MLM_FAMILY_HINT = ("start one from an embedder by training its MLM head first: `encoderkit pretrain --config DIR "
                   "--objective mlm --train head ...` (a short warm-up on in-domain text), then train-embedder "
                   "--kind sparse --start-active-terms 500 (README: Retrieval beyond one dense vector)")


def check_splade_settings(pooling: str, activation: str) -> None:
    if pooling not in SPLADE_POOLING:
        raise InputError(f"unknown SPLADE pooling {pooling!r}; choose one of {', '.join(SPLADE_POOLING)}")
    if activation not in SPLADE_ACTIVATIONS:
        raise InputError(f"unknown SPLADE activation {activation!r}; choose one of {', '.join(SPLADE_ACTIVATIONS)}")


def splade_weights(logits: torch.Tensor, activation: str = "relu") -> torch.Tensor:
    """log(1 + ReLU(logits)), and log1p once more for "log1p_relu"."""
    weights = torch.log1p(torch.relu(logits))
    return torch.log1p(weights) if activation == "log1p_relu" else weights


def _load_mlm(path: str | Path | None, what: str, *, allow_pickle: bool = False):
    """(MLM model, tokenizer, SparseEncoderInfo or None) of a sparse encoder directory or a plain MLM checkpoint;
    an InputError where the checkpoint has no trained MLM head."""
    from ..modeling.models import load_model
    from ..io.st_format import is_sparse_encoder, read_sparse_encoder

    resolved = resolve_model(path)
    info = read_sparse_encoder(resolved.root) if is_sparse_encoder(resolved.root) else None
    try:
        model = load_model(resolved, task="masked-lm", allow_pickle=allow_pickle, head_required=what)
    except CheckpointError as exc:
        raise InputError(f"{exc}. {MLM_FAMILY_HINT}") from exc
    except InputError as exc:  # a family without an MLM head
        raise InputError(f"{what} needs a masked-language-model head: {exc}") from exc
    return model, Tokenizer.from_pretrained(resolved.tokenizer_dir), info


class SparseEmbedder:
    """Text -> SPLADE sparse vector over the tokenizer's vocabulary.

    ``pooling``: "max" (SPLADE v2 and later) or "sum"; ``activation``: "relu" or "log1p_relu".
    ``max_active_dims``: keep each vector's k largest weights (sentence-transformers' ``max_active_dims``).
    ``dtype``, ``token_budget``, ``device``: the engine's (``encoderkit.tasks.embed.Embedder``); the MLM head runs
    in fp32. Prompts as ``Embedder``'s: ``encode_query`` / ``encode_document`` use the model's "query" /
    "document" prompts where it defines them, as sentence-transformers does.
    """

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, *, pooling: str = "max", activation: str = "relu",
                 max_length: int | None = None, max_active_dims: int | None = None, dtype: str = "fp32",
                 token_budget: int | None = None, device: str | torch.device | None = None,
                 prompts: dict[str, str] | None = None, default_prompt_name: str | None = None) -> None:
        from ..engine import engine_for

        if getattr(model, "mlm_head", None) is None:
            raise InputError(f"a SPLADE encoder needs a model with a masked-language-model head, found "
                             f"{type(model).__name__}; load it with task='masked-lm'. {MLM_FAMILY_HINT}")
        check_splade_settings(pooling, activation)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pooling, self.activation = pooling, activation
        self.max_active_dims = check_max_active_dims(max_active_dims)
        self.max_length = min(max_length or tokenizer.model_max_length, model.config.max_sequence_length)
        if self.max_length < 3:
            raise InputError(f"max_length must leave room for text between the special tokens, found {max_length}")
        self.engine = engine_for(model, dtype, "embed", token_budget, tokenizer=tokenizer, device=device)
        self.prompts = dict(prompts or {})
        self.default_prompt_name = default_prompt_name

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, allow_pickle: bool = False,
                        **options) -> "SparseEmbedder":
        """A sentence-transformers SparseEncoder directory (its pooling, activation, length and prompts), or any
        checkpoint with a trained MLM head (max pooling, ReLU: what ``SparseEncoder(dir)`` builds for one)."""
        model, tokenizer, info = _load_mlm(path, "a SPLADE encoder", allow_pickle=allow_pickle)
        settings = {} if info is None else dict(
            pooling=info.pooling, activation=info.activation, max_length=info.max_seq_length,
            prompts=info.prompts, default_prompt_name=info.default_prompt_name)
        return cls(model, tokenizer, **{**settings, **options})

    @property
    def dimension(self) -> int:
        """The length of the vectors: the vocabulary size of the MLM head."""
        return int(self.model.mlm_head.decoder.weight.shape[0])

    @property
    def vocabulary(self) -> list[str]:
        """The token of each dimension (for showing which terms a vector holds)."""
        return [token or "" for token in self.tokenizer.convert_ids_to_tokens(range(self.dimension))]

    def prompt_of(self, prompt: str | None, prompt_name: str | None) -> str | None:
        """The text to prepend, by the rule dense embedders follow (``tasks.embed.choose_prompt``)."""
        from ..tasks.embed import choose_prompt

        return choose_prompt(self.prompts, self.default_prompt_name, prompt, prompt_name)

    def encode_query(self, texts: Sequence[str] | str, **options) -> SparseVectors:
        """``encode`` with the model's "query" prompt where it has one (sentence-transformers' ``encode_query``)."""
        return self.encode(texts, **({"prompt_name": "query"} if "query" in self.prompts else {}), **options)

    def encode_document(self, texts: Sequence[str] | str, **options) -> SparseVectors:
        """``encode`` with the model's "document" prompt where it has one."""
        return self.encode(texts, **({"prompt_name": "document"} if "document" in self.prompts else {}), **options)

    @torch.inference_mode()
    def encode(self, texts: Sequence[str] | str, *, batch_size: int = MAX_BATCH_SIZE,
               max_active_dims: int | None = None, prompt: str | None = None, prompt_name: str | None = None,
               progress: Callable[[int], None] | None = None) -> SparseVectors:
        """The sparse vectors of ``texts``, in input order (one row each; a single string: one row too).
        ``max_active_dims`` (default: the embedder's) keeps each row's k largest weights."""
        if isinstance(texts, str):
            texts = [texts]
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise InputError(f"texts[{index}] must be a string, found {type(text).__name__}")
        if batch_size <= 0:
            raise InputError(f"batch_size must be positive, found {batch_size}")
        keep = check_max_active_dims(max_active_dims) or self.max_active_dims
        chosen = self.prompt_of(prompt, prompt_name)
        texts = [chosen + t for t in texts] if chosen else list(texts)
        ids, types = self.tokenizer.encode_ids(texts, max_length=self.max_length) if texts else ([], [])
        return self.encode_tokens(ids, types, batch_size=batch_size, max_active_dims=keep, progress=progress)

    @torch.inference_mode()
    def encode_tokens(self, ids: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None = None, *,
                      batch_size: int | None = None, max_active_dims: int | None = None,
                      progress: Callable[[int], None] | None = None) -> SparseVectors:
        """The sparse vectors of sequences tokenised by the caller (the server tokenises to count and check
        lengths before queueing), in input order."""
        keep = check_max_active_dims(max_active_dims) or self.max_active_dims
        parts: list[SparseVectors] = []
        order: list[np.ndarray] = []
        for indices, states, packing in self.engine.run(ids, types, max_batch_size=batch_size):
            parts.append(SparseVectors.from_dense(self.pool_states(states, packing.cu_seqlens), keep))
            order.append(np.asarray(indices))
            if progress is not None:
                progress(len(indices))
        if not parts:
            return SparseVectors(np.zeros(1), np.zeros(0), np.zeros(0), self.dimension)
        return SparseVectors.concatenate(parts)[np.argsort(np.concatenate(order), kind="stable")]

    def pool_states(self, states: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """(sequences, vocabulary) SPLADE weights of packed final states (tokens, hidden), sequence k being rows
        ``cu_seqlens[k]:cu_seqlens[k+1]``: the MLM head on ``LOGIT_CHUNK_TOKENS`` tokens at a time, each chunk's
        weights reduced into its sequences' rows at once (max or sum; weights are >= 0, so a max from 0 is theirs)."""
        bounds = cu_seqlens.to("cpu", torch.long)
        sequences = len(bounds) - 1
        owner = torch.repeat_interleave(torch.arange(sequences), bounds[1:] - bounds[:-1]).to(states.device)
        out = torch.zeros(sequences, self.dimension, dtype=torch.float32, device=states.device)
        head = self.model.mlm_head
        for begin in range(0, states.shape[0], LOGIT_CHUNK_TOKENS):
            chunk = states[begin:begin + LOGIT_CHUNK_TOKENS]
            logits = head(chunk.to(head.decoder.weight.dtype)).float()
            weights = splade_weights(logits, self.activation)
            rows = owner[begin:begin + LOGIT_CHUNK_TOKENS]
            if self.pooling == "max":
                out.index_reduce_(0, rows, weights, "amax", include_self=True)
            else:
                out.index_add_(0, rows, weights)
        return out.cpu()

    def save_pretrained(self, directory: str | Path) -> Path:
        """The model and tokenizer in the HF format, with sentence-transformers' SparseEncoder files beside them."""
        from ..io.st_format import write_sparse_encoder

        self.model.save_pretrained(directory, tokenizer=self.tokenizer)
        return write_sparse_encoder(directory, pooling=self.pooling, activation=self.activation,
                                    max_seq_length=self.max_length, prompts=self.prompts,
                                    default_prompt_name=self.default_prompt_name)


class SparseModel(nn.Module):
    """The trainable SPLADE encoder: ``forward(input_ids, attention_mask, token_type_ids)`` -> (batch, vocabulary)
    weights with gradients, pooled over each text's tokens as ``SparseEmbedder`` pools (padding excluded), for
    ``SpladeLoss``. ``save_pretrained`` writes a sentence-transformers SparseEncoder directory."""

    def __init__(self, mlm_model: nn.Module, *, pooling: str = "max", activation: str = "relu",
                 tokenizer: Tokenizer | None = None, max_length: int | None = None,
                 prompts: dict[str, str] | None = None) -> None:
        super().__init__()
        if getattr(mlm_model, "mlm_head", None) is None:
            raise InputError(f"SparseModel needs a model with a masked-language-model head, found "
                             f"{type(mlm_model).__name__}. {MLM_FAMILY_HINT}")
        check_splade_settings(pooling, activation)
        self.mlm = mlm_model
        self.pooling, self.activation = pooling, activation
        self.tokenizer = tokenizer
        limit = mlm_model.config.max_sequence_length
        if max_length is None and tokenizer is not None:
            max_length = tokenizer.model_max_length
        self.max_length = min(max_length or limit, limit)
        self.prompts = dict(prompts or {})

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, max_length: int | None = None,
                        **options) -> "SparseModel":
        model, tokenizer, info = _load_mlm(path, "a SPLADE encoder")
        settings = {} if info is None else dict(pooling=info.pooling, activation=info.activation,
                                                max_length=info.max_seq_length, prompts=info.prompts)
        if max_length is not None:
            settings["max_length"] = max_length
        return cls(model, tokenizer=tokenizer, **{**settings, **options})

    @property
    def encoder(self) -> nn.Module:
        """The MLM model, which is what a checkpoint holds (``EmbedderTraining`` saves and loads it)."""
        return self.mlm

    @property
    def dimension(self) -> int:
        return int(self.mlm.mlm_head.decoder.weight.shape[0])

    def tokenize(self, texts: Sequence[str]) -> BatchEncoding:
        if self.tokenizer is None:
            raise InputError("this SparseModel has no tokenizer; pass tokenizer= or use from_pretrained")
        return self.tokenizer.encode_batch([texts] if isinstance(texts, str) else list(texts),
                                           max_length=self.max_length)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The MLM head runs on ``LOGIT_CHUNK_TOKENS`` of the batch's token rows at a time, each chunk pooled at once;
        in training a chunk's (tokens x vocabulary) logits are recomputed in the backward pass rather than kept
        (``torch.utils.checkpoint``), so memory holds one chunk's logits, not the batch's: a batch of 32 texts of
        256 tokens would otherwise keep several (32 x 256 x 30,522) fp32 tensors, a gigabyte each."""
        from torch.utils.checkpoint import checkpoint

        recompute = self.training and torch.is_grad_enabled()
        pooled = None
        for chunk, chunk_mask in self._token_chunks(input_ids, attention_mask, token_type_ids):
            part = checkpoint(self._pool_chunk, chunk, chunk_mask, use_reentrant=False) if recompute \
                else self._pool_chunk(chunk, chunk_mask)
            pooled = part if pooled is None else (torch.maximum(pooled, part) if self.pooling == "max"
                                                  else pooled + part)
        return pooled

    @torch.no_grad()
    def max_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, vocabulary): each term's largest MLM logit over a text's tokens, padding left out; a term is
        active in the text's vector exactly where this is above zero (``calibrate_active_terms``)."""
        best = None
        for chunk, chunk_mask in self._token_chunks(input_ids, attention_mask, token_type_ids):
            logits = self.mlm.mlm_head(chunk).float().masked_fill(chunk_mask[..., None] == 0, float("-inf"))
            most = logits.amax(dim=1)
            best = most if best is None else torch.maximum(best, most)
        return best

    def _token_chunks(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      token_type_ids: torch.Tensor | None):
        """The encoder's final states and the mask, in slices of ``LOGIT_CHUNK_TOKENS`` of the batch's token rows:
        the head's (tokens x vocabulary) logits then exist for one slice at a time."""
        hidden = self.mlm.encoder(input_ids, attention_mask, token_type_ids).last_hidden_state
        mask = attention_mask.to(torch.float32)
        step = max(1, LOGIT_CHUNK_TOKENS // max(1, hidden.shape[0]))
        for start in range(0, hidden.shape[1], step):
            yield hidden[:, start:start + step], mask[:, start:start + step]

    def _pool_chunk(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = splade_weights(self.mlm.mlm_head(hidden).float(), self.activation) * mask[..., None]
        return weights.amax(dim=1) if self.pooling == "max" else weights.sum(dim=1)

    def save_pretrained(self, directory: str | Path, tokenizer: Tokenizer | None = None) -> Path:
        from ..io.st_format import write_sparse_encoder

        self.mlm.save_pretrained(directory, tokenizer=tokenizer or self.tokenizer)
        return write_sparse_encoder(directory, pooling=self.pooling, activation=self.activation,
                                    max_seq_length=self.max_length, prompts=self.prompts)


@torch.no_grad()
def calibrate_active_terms(model: SparseModel, texts: Sequence[str], active_terms: int,
                           batch_size: int = 16) -> dict[str, float]:
    """Subtract one constant from the MLM head's decoder bias so that ``texts`` start with ``active_terms``
    non-zero weights each, on average; returns {"shift", "active_before", "active_after"}.

    Why: cross-entropy fixes an MLM head's logits only up to a constant per position, so nothing in MLM training
    keeps most of them below zero, which SPLADE's log(1 + ReLU) needs for sparse vectors. BERT's own head happens to
    keep them there; a head just trained on an embedder (``encoderkit pretrain --train head``) need not, and its
    vectors can hold every term of the vocabulary: their dot products are then in the thousands, and a short
    SPLADE run with FLOPS regularisation cannot bring them back. The shift leaves each position's ranking of the
    terms as it is. A term is active in a text exactly where its largest logit over the text's tokens is above zero
    (for max and sum pooling, with either activation), and the constant moves each of those maxima by itself: so
    the shift is the value between the (active_terms x texts)-th and the next largest of the texts' maxima."""
    bias = model.mlm.mlm_head.decoder.bias
    texts = list(texts)
    if bias is None:
        raise InputError("this MLM head's decoder has no bias to shift; train without --start-active-terms")
    if not texts:
        raise InputError("no texts to calibrate the sparse vectors' active terms on")
    if not 1 <= active_terms < model.dimension:
        raise InputError(f"--start-active-terms must be between 1 and the vocabulary size - 1 "
                         f"({model.dimension - 1}), found {active_terms}")
    was_training = model.training
    model.eval()
    maxima = [model.max_logits(**model.tokenize(texts[start:start + batch_size]).model_inputs())
              for start in range(0, len(texts), batch_size)]
    values = torch.cat(maxima).flatten()
    wanted = active_terms * len(texts)
    top = torch.topk(values, wanted + 1).values
    shift = float(top[wanted - 1] + top[wanted]) / 2
    bias.sub_(shift)
    model.train(was_training)
    return {"shift": shift, "active_before": float((values > 0).sum()) / len(texts),
            "active_after": float((values > shift).sum()) / len(texts)}


__all__ = ["SPLADE_ACTIVATIONS", "SPLADE_POOLING", "SparseEmbedder", "SparseModel", "SparseVectors",
           "calibrate_active_terms", "splade_weights"]
