"""Multi-vector embeddings for late interaction (ColBERT; Khattab & Zaharia, 2020, arXiv:2004.12832): a text becomes
one vector per token, and a query scores a document by MaxSim,

    S(q, d) = sum_i max_j <q_i, d_j>,

the sum over the query's token vectors of the best dot product with any of the document's. Each token vector is a
linear projection (no bias, 128 dimensions by default) of the encoder's last hidden state, L2-normalised, so the
dot products are cosines.

The tokenisation is PyLate's (lightonai/pylate, ``models.ColBERT``), which the models of its format were trained
with:

- a marker token goes right after the first token ([CLS]): "[Q] " for queries, "[D] " for documents, tokens that
  PyLate adds to the vocabulary (``from_pretrained`` of a plain encoder adds them too) and inserts by id;
- queries are cut to ``query_length`` tokens (32), marker included, and, with query expansion (on by default),
  padded to exactly that length with [MASK] tokens. The masks yield vectors that count in MaxSim (ColBERT's query
  augmentation); with ``attend_to_expansion_tokens`` false (the default) no token attends to them, they attend
  to the text;
- documents are cut to ``document_length`` tokens (180), marker included, and the vectors of tokens in
  ``skiplist_words`` (punctuation by default) are dropped. A skiplist word that is not one vocabulary token is
  left out of the skiplist (PyLate would then skip every [UNK] token; sentence-transformers 6 drops it as here).

``MultiVectorEmbedder`` encodes on the inference engine (packed batches; queries whose expansion tokens are not
attended run as one padded grid with those keys masked). ``MultiVectorModel`` is the trainable counterpart, for
``losses.MaxSimMultipleNegativesRankingLoss``. Both read and write PyLate's directory: a sentence-transformers
directory with a Transformer and a ``pylate.models.Dense.Dense`` projection (``1_Dense/``), whose
config_sentence_transformers.json holds the settings above. sentence-transformers 6's ``MultiVectorEncoder``
reads it too (tests/embeddings/test_multi_vector.py compares the two; bench/pylate_parity.py compares with PyLate).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CheckpointError, InputError
from ..io.hub import resolve_model
from ..modeling.encoder import EncoderModel
from ..modeling.packing import MAX_BATCH_SIZE
from ..io.st_format import is_multi_vector_dir
from .multi_vector_io import (_SETTING_KEYS, MultiVectorDirectory, MultiVectorSettings, read_multi_vector_dir,
                              write_multi_vector_dir)
from ..tokenizer import Tokenizer

log = logging.getLogger(__name__)

DEFAULT_DIMENSION = 128
# Elements of the (queries, documents, query tokens, document tokens) similarity block scored at once by ``maxsim``.
SCORE_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class TokenIds:
    """The settings' token ids in one tokenizer: the markers (None: no marker), the expansion token, the skiplist."""

    query_marker: int | None
    document_marker: int | None
    expansion: int
    skiplist: tuple[int, ...]

    @classmethod
    def resolve(cls, tokenizer: Tokenizer, settings: MultiVectorSettings) -> "TokenIds":
        def marker(prefix: str, kind: str) -> int | None:
            if not prefix:
                return None
            found = tokenizer.convert_tokens_to_ids([prefix])[0]
            if found is None:
                raise InputError(f"the {kind} marker {prefix!r} is not a token of this tokenizer; load the model with "
                                 "MultiVectorModel.from_pretrained, which adds the markers to a plain encoder's "
                                 f"vocabulary, or set {kind}_prefix to one of its tokens (\"\" for none)")
            return found

        expansion = tokenizer.mask_token_id
        if expansion is None:
            expansion = tokenizer.token_id("eos")  # PyLate's fallback for a tokenizer without a mask token
        if expansion is None:
            if settings.do_query_expansion:
                raise InputError("query expansion pads queries with the tokenizer's mask token, and this tokenizer "
                                 "has none (nor an end-of-sequence token); set do_query_expansion to false")
            expansion = tokenizer.pad_token_id
        found = tokenizer.convert_tokens_to_ids(settings.skiplist_words)
        skiplist = tuple(sorted({token for token in found if token is not None}))
        return cls(marker(settings.query_prefix, "query"), marker(settings.document_prefix, "document"), expansion,
                   skiplist)


@dataclass
class TokenizedTexts:
    """Texts as PyLate tokenises them, unpadded: ids and type ids per text, and how many of each text's first
    tokens are attended (the rest: query expansion tokens that no token attends to)."""

    ids: list[list[int]]
    types: list[list[int]]
    attended: list[int]
    limit: int = 0  # the length texts were cut to, marker included
    truncated: int = 0  # how many texts were cut

    def padded(self, pad_id: int) -> dict[str, torch.Tensor]:
        """(texts, longest) input_ids, attention_mask and token_type_ids."""
        width = max(len(row) for row in self.ids)
        input_ids = torch.full((len(self.ids), width), pad_id, dtype=torch.long)
        types = torch.zeros((len(self.ids), width), dtype=torch.long)
        attention = torch.zeros((len(self.ids), width), dtype=torch.long)
        for row, (ids, segment, attended) in enumerate(zip(self.ids, self.types, self.attended)):
            input_ids[row, :len(ids)] = torch.tensor(ids)
            types[row, :len(segment)] = torch.tensor(segment)
            attention[row, :attended] = 1
        return {"input_ids": input_ids, "attention_mask": attention, "token_type_ids": types}


def tokenize_texts(tokenizer: Tokenizer, texts: Sequence[str] | str, *, is_query: bool,
                   settings: MultiVectorSettings, ids: TokenIds, model_limit: int,
                   prompt: str | None = None) -> TokenizedTexts:
    """PyLate's tokenisation (see the module docstring): stripped texts (as sentence-transformers strips them),
    cut to the query or document length less the marker, the marker inserted after the first token, queries padded
    with the expansion token. ``model_limit``: the encoder's maximum length, which caps the document length."""
    if not isinstance(is_query, (bool, np.bool_)):
        raise InputError(f"is_query must be True (queries) or False (documents), found {is_query!r}")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, Sequence):
        raise InputError(f"texts must be a string or a list of strings, found {type(texts).__name__}")
    if not len(texts):
        raise InputError("give at least one text to encode, as a list of strings")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"texts[{index}] must be a string, found {type(text).__name__}")
    marker = ids.query_marker if is_query else ids.document_marker
    limit = settings.query_length if is_query else settings.document_length
    if limit > model_limit:
        if is_query:
            raise InputError(f"query_length {limit} is longer than this model reads ({model_limit} tokens); "
                             f"set query_length to at most {model_limit}")
        limit = model_limit
    text_limit = limit - (marker is not None)
    stripped = [((prompt or "") + text).strip() for text in texts]
    encodings = tokenizer.encode_raw(stripped, max_length=text_limit)
    expand = is_query and settings.do_query_expansion
    out = TokenizedTexts([], [], [], limit=limit)
    for encoding in encodings:
        row, segment = list(encoding.ids), list(encoding.type_ids)
        out.truncated += bool(encoding.overflowing)
        if marker is not None:
            row[1:1] = [marker]
            segment[1:1] = [0]
        attended = len(row)
        if expand:
            row += [ids.expansion] * (limit - len(row))
            segment += [0] * (limit - len(segment))
            if settings.attend_to_expansion_tokens:
                attended = len(row)
        out.ids.append(row)
        out.types.append(segment)
        out.attended.append(attended)
    return out


def scoring_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor, *, is_query: bool,
                 settings: MultiVectorSettings, skiplist: Sequence[int]) -> torch.Tensor:
    """(batch, length) bool: the tokens whose vectors count in MaxSim. Queries with expansion: every token (the
    expansion tokens are not attended, yet count); other queries: the attended tokens; documents: the attended
    tokens not in the skiplist."""
    if is_query:
        if settings.do_query_expansion:
            return torch.ones_like(input_ids, dtype=torch.bool)
        return attention_mask.bool()
    mask = attention_mask.bool()
    if skiplist:
        skipped = torch.isin(input_ids, torch.tensor(list(skiplist), dtype=input_ids.dtype, device=input_ids.device))
        mask = mask & ~skipped  # not in place: the caller's mask may be this very tensor
    return mask


# ---------------------------------------------------------------------------------------------
# MaxSim
# ---------------------------------------------------------------------------------------------
def maxsim_scores(queries: torch.Tensor, documents: torch.Tensor, query_mask: torch.Tensor | None = None,
                  document_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(Q, Lq, d) queries and (D, Ld, d) documents, padded, with their masks of the tokens that count (None: all)
    -> (Q, D) MaxSim scores, differentiable. A document token that does not count is left out of the max (not
    scored 0, as PyLate's training scores do, which lets padding beat a negative similarity); a query token that
    does not count adds nothing. A document with no token that counts scores the lowest finite value."""
    similarities = torch.einsum("qsh,dth->qdst", queries, documents)
    lowest = torch.finfo(similarities.dtype).min
    if document_mask is not None:
        similarities = similarities.masked_fill(~document_mask.bool()[None, :, None, :], lowest)
    best = similarities.max(dim=-1).values  # (Q, D, Lq)
    if query_mask is not None:
        best = best.masked_fill(~query_mask.bool()[:, None, :], 0.0)
    scores = best.sum(dim=-1)
    if document_mask is not None:
        empty = ~document_mask.bool().any(dim=-1)
        if bool(empty.any()):
            scores = scores.masked_fill(empty[None, :], lowest)
    return scores


def _as_tensor(vectors: Any, what: str) -> torch.Tensor:
    tensor = torch.as_tensor(vectors) if not isinstance(vectors, torch.Tensor) else vectors
    if tensor.dim() != 2 or not tensor.is_floating_point():
        raise InputError(f"{what} must be a float array of shape (tokens, dimension), found "
                         f"{tensor.dtype} {tuple(tensor.shape)}")
    return tensor.float()


def pad_vectors(vectors: Sequence[Any], what: str = "vectors") -> tuple[torch.Tensor, torch.Tensor]:
    """A list of (tokens_i, d) arrays -> (n, longest, d) float32 zero-padded, and the (n, longest) bool mask."""
    rows = [_as_tensor(v, f"{what}[{i}]") for i, v in enumerate(vectors)]
    if not rows:
        raise InputError(f"{what} is empty")
    dims = {row.shape[1] for row in rows}
    if len(dims) > 1:
        raise InputError(f"{what} mix dimensions {sorted(dims)}; encode them with one model")
    longest = max(row.shape[0] for row in rows)
    padded = torch.zeros(len(rows), longest, dims.pop())
    mask = torch.zeros(len(rows), longest, dtype=torch.bool)
    for index, row in enumerate(rows):
        padded[index, :len(row)] = row
        mask[index, :len(row)] = True
    return padded, mask


def maxsim(query_vectors: Any, document_vectors: Any) -> float | np.ndarray:
    """MaxSim of one query's (tokens, d) vectors with one document's: a float. Given lists of them (``encode``'s
    output): the (queries, documents) float32 matrix of every pair's score, in chunks of documents so that the
    (queries x documents x tokens x tokens) similarities never exist at once."""
    single = not isinstance(query_vectors, (list, tuple))
    if single != (not isinstance(document_vectors, (list, tuple))):
        raise InputError("maxsim takes one query's vectors and one document's, or a list of each")
    queries, query_mask = pad_vectors([query_vectors] if single else query_vectors, "query vectors")
    documents, document_mask = pad_vectors([document_vectors] if single else document_vectors, "document vectors")
    if queries.shape[2] != documents.shape[2]:
        raise InputError(f"query vectors have {queries.shape[2]} dimensions, document vectors "
                         f"{documents.shape[2]}; encode both with one model")
    per_document = max(1, queries.shape[0] * queries.shape[1] * documents.shape[1])
    step = max(1, SCORE_CHUNK_ELEMENTS // per_document)
    with torch.inference_mode():
        scores = torch.cat([maxsim_scores(queries, documents[i:i + step], query_mask, document_mask[i:i + step])
                            for i in range(0, documents.shape[0], step)], dim=1)
    return float(scores[0, 0]) if single else scores.numpy()


def _load(path: str | Path | None, allow_pickle: bool) -> tuple[EncoderModel, Tokenizer, MultiVectorDirectory | None]:
    """The encoder, its tokenizer and, for a PyLate directory, its projection and settings."""
    from ..modeling.models import load_model

    resolved = resolve_model(path)
    stored = read_multi_vector_dir(resolved.root, allow_pickle=allow_pickle) \
        if is_multi_vector_dir(resolved.root) else None
    weights_dir = stored.weights_dir if stored else resolved.weights_dir
    encoder = load_model(weights_dir if stored else resolved.root, task="base", allow_pickle=allow_pickle)
    tokenizer = Tokenizer.from_pretrained(weights_dir)
    return encoder, tokenizer, stored


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


def _check_projection(projection: nn.Linear | Sequence[nn.Linear], hidden: int) -> nn.ModuleList:
    layers = [projection] if isinstance(projection, nn.Linear) else list(projection)
    if not layers or not all(isinstance(layer, nn.Linear) for layer in layers):
        raise InputError("the projection must be an nn.Linear (or a list of them, applied in order)")
    width = hidden
    for index, layer in enumerate(layers):
        if layer.in_features != width:
            raise InputError(f"projection layer {index} takes {layer.in_features} features, but receives {width} "
                             f"(the encoder's hidden size is {hidden})")
        width = layer.out_features
    return nn.ModuleList(layers)


def _project(projection: nn.ModuleList, hidden: torch.Tensor) -> torch.Tensor:
    """Token states -> L2-normalised token vectors (PyLate's Dense layers, then its per-token normalisation)."""
    for layer in projection:
        hidden = layer(hidden)
    return F.normalize(hidden, p=2, dim=-1)


# ---------------------------------------------------------------------------------------------
# Inference
# ---------------------------------------------------------------------------------------------
class MultiVectorEmbedder:
    """Texts -> per-token vectors, on the inference engine. ``MultiVectorEmbedder.from_pretrained(path)`` reads a
    PyLate directory. ``dtype`` / ``token_budget`` / ``device``: as ``Embedder`` (fp32 is exact)."""

    def __init__(self, encoder: EncoderModel, tokenizer: Tokenizer, projection: nn.Linear | Sequence[nn.Linear], *,
                 settings: MultiVectorSettings | None = None, dtype: str | torch.dtype = "fp32",
                 token_budget: int | None = None, device: str | torch.device | None = None) -> None:
        from ..engine import engine_for

        if not isinstance(encoder, EncoderModel):
            raise InputError(f"MultiVectorEmbedder needs an encoderkit EncoderModel (load_model(path, task='base')), "
                             f"found {type(encoder).__name__}")
        self.encoder = encoder.eval()
        self.tokenizer = tokenizer
        self.settings = settings or MultiVectorSettings()
        self.projection = _check_projection(projection, encoder.config.hidden_size).eval()
        self.token_ids = TokenIds.resolve(tokenizer, self.settings)
        self.engine = engine_for(encoder, dtype, "embed", token_budget, tokenizer=tokenizer, device=device)
        self.projection.to(self.encoder.embeddings.word.weight.device)

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, allow_pickle: bool = False,
                        **options: Any) -> "MultiVectorEmbedder":
        """A PyLate directory (a path or hub id). Settings can be overridden by name (``query_length=64``); the rest
        of ``options`` go to the constructor (dtype, token_budget, device)."""
        overrides = {key: options.pop(key) for key in list(options) if key in _SETTING_KEYS}
        encoder, tokenizer, stored = _load(path, allow_pickle)
        if stored is None:
            raise InputError(f"{path} is not a multi-vector (PyLate) model: it has no projection after its encoder. "
                             "Train one first (MultiVectorModel.from_pretrained(path) adds a new projection), or "
                             "load a PyLate ColBERT directory")
        return cls(encoder, tokenizer, [_linear(w, b) for w, b in stored.layers],
                   settings=stored.settings.with_overrides(**overrides), **options)

    @property
    def dimension(self) -> int:
        return self.projection[-1].out_features

    def tokenize(self, texts: Sequence[str] | str, *, is_query: bool) -> TokenizedTexts:
        settings = self.settings
        prompt = settings.prompts.get(settings.default_prompt_name) if settings.default_prompt_name else None
        return tokenize_texts(self.tokenizer, texts, is_query=is_query, settings=settings, ids=self.token_ids,
                              model_limit=self.encoder.config.max_sequence_length, prompt=prompt)

    def encode(self, texts: Sequence[str] | str, *, is_query: bool | None = None, batch_size: int = MAX_BATCH_SIZE,
               convert_to: str = "numpy", padded: bool = False,
               progress: Callable[[int], None] | None = None) -> Any:
        """The token vectors of each text, in input order: a list of float32 (tokens_i, dimension) arrays (tensors
        with ``convert_to="torch"``), unit length, only the tokens that count (see the module docstring). A single
        string gives one array. ``padded=True``: instead a (texts, longest, dimension) float32 tensor, zeros where
        a text has no token, and the (texts, longest) bool mask of its tokens.

        ``is_query`` is required: queries and documents are tokenised differently. ``progress`` is called with each
        batch's text count."""
        if convert_to not in ("numpy", "torch"):
            raise InputError(f"convert_to must be 'numpy' or 'torch', found {convert_to!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise InputError(f"batch_size must be a positive integer, found {batch_size!r}")
        single = isinstance(texts, str)
        tokens = self.tokenize(texts, is_query=is_query)
        if tokens.truncated and not is_query:
            log.warning("%d of %d documents are longer than %d tokens and were truncated (document_length)",
                        tokens.truncated, len(tokens.ids), tokens.limit)
        if is_query and self.settings.do_query_expansion and not self.settings.attend_to_expansion_tokens:
            vectors = self._encode_masked_queries(tokens, batch_size, progress)
        else:
            vectors = self._encode_packed(tokens, is_query, batch_size, progress)
        if padded:
            return pad_vectors(vectors)
        if convert_to == "numpy":
            vectors = [v.numpy() for v in vectors]
        return vectors[0] if single else vectors

    def encode_query(self, texts: Sequence[str] | str, **options: Any) -> Any:
        """``encode(texts, is_query=True, ...)``, as sentence-transformers' ``encode_query``."""
        return self.encode(texts, is_query=True, **options)

    def encode_document(self, texts: Sequence[str] | str, **options: Any) -> Any:
        """``encode(texts, is_query=False, ...)``, as sentence-transformers' ``encode_document``."""
        return self.encode(texts, is_query=False, **options)

    def _encode_packed(self, tokens: TokenizedTexts, is_query: bool, batch_size: int,
                       progress: Callable[[int], None] | None) -> list[torch.Tensor]:
        """Every token attended: packed batches on the engine, projected and selected per text."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(tokens.ids)
        skip = None if is_query or not self.token_ids.skiplist else \
            torch.tensor(self.token_ids.skiplist, dtype=torch.long)
        for indices, states, packing in self.engine.run(tokens.ids, tokens.types, max_batch_size=batch_size):
            with torch.inference_mode():
                vectors = _project(self.projection, states.float()).to("cpu", torch.float32)
            starts = packing.cu_seqlens.tolist()
            for k, i in enumerate(indices.tolist()):
                rows = vectors[starts[k]:starts[k + 1]]
                if skip is not None:
                    rows = rows[~torch.isin(torch.tensor(tokens.ids[i]), skip)]
                out[i] = rows.clone()
            if progress is not None:
                progress(len(indices))
        return out

    def _encode_masked_queries(self, tokens: TokenizedTexts, batch_size: int,
                               progress: Callable[[int], None] | None) -> list[torch.Tensor]:
        """Queries whose expansion tokens no token attends to, yet that have vectors: a key mask, which packing
        cannot express (it drops masked tokens), so these run as padded grids of ``query_length`` tokens with those
        keys masked, in batches within the engine's token budget."""
        device = self.encoder.embeddings.word.weight.device
        length = len(tokens.ids[0])
        step = max(1, min(batch_size, self.engine.precision.token_budget // length))
        bias = torch.zeros(1, 1, length, length, device=device)
        out: list[torch.Tensor] = []
        use_types = self.encoder.config.type_vocab_size >= 2
        with torch.inference_mode():
            for begin in range(0, len(tokens.ids), step):
                part = TokenizedTexts(tokens.ids[begin:begin + step], tokens.types[begin:begin + step],
                                      tokens.attended[begin:begin + step]).padded(self.tokenizer.pad_token_id)
                hidden = self.encoder(part["input_ids"].to(device), part["attention_mask"].to(device),
                                      part["token_type_ids"].to(device) if use_types else None,
                                      attention_bias=bias).last_hidden_state
                vectors = _project(self.projection, hidden.float()).to("cpu", torch.float32)
                out.extend(row.clone() for row in vectors)
                if progress is not None:
                    progress(len(vectors))
        return out

    def maxsim(self, query_vectors: Any, document_vectors: Any) -> float | np.ndarray:
        """``maxsim`` (the module function) of this embedder's vectors."""
        return maxsim(query_vectors, document_vectors)


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def add_marker_tokens(encoder: EncoderModel, tokenizer: Tokenizer, settings: MultiVectorSettings) -> list[str]:
    """Add the query and document markers a plain encoder lacks to its tokenizer and word embeddings, as PyLate
    does: the embedding matrix is first cut (or grown) to the tokenizer's size, then one row per new token is added,
    the mean of the others (transformers' ``resize_token_embeddings`` draws them from a normal distribution
    around that mean with 1e-9 times the rows' covariance). Returns the tokens added."""
    wanted = [prefix for prefix in dict.fromkeys((settings.query_prefix, settings.document_prefix)) if prefix]
    missing = [prefix for prefix in wanted if tokenizer.convert_tokens_to_ids([prefix])[0] is None]
    if not missing:
        return []
    before = tokenizer.vocab_size
    word = encoder.embeddings.word
    if word.num_embeddings < before:
        raise CheckpointError(f"the tokenizer has {before} tokens but the model only {word.num_embeddings} word "
                              "embeddings; they do not belong together")
    tokenizer.add_tokens(missing)  # as transformers' add_tokens with strings: not special, normalised like the text
    after = tokenizer.vocab_size
    with torch.no_grad():
        kept = word.weight[:before]
        rows = kept.mean(dim=0, keepdim=True).expand(after - before, -1)
        grown = nn.Embedding(after, word.embedding_dim, padding_idx=word.padding_idx,
                             device=word.weight.device, dtype=word.weight.dtype)
        grown.weight.copy_(torch.cat([kept, rows]))
    encoder.embeddings.word = grown
    encoder.config.vocab_size = after
    return missing


class MultiVectorModel(nn.Module):
    """Text -> token vectors, trainable end to end: ``normalize(projection(encoder(tokens)))`` per token.

    ``forward`` returns the (batch, length, dimension) vectors, zero where a token does not count, and the
    (batch, length) mask of the tokens that count: what ``MaxSimMultipleNegativesRankingLoss`` takes."""

    def __init__(self, encoder: EncoderModel, projection: nn.Linear | Sequence[nn.Linear], *,
                 tokenizer: Tokenizer | None = None, settings: MultiVectorSettings | None = None) -> None:
        super().__init__()
        if not isinstance(encoder, EncoderModel):
            raise InputError(f"MultiVectorModel needs an encoderkit EncoderModel (load_model(path, task='base')), "
                             f"found {type(encoder).__name__}")
        self.encoder = encoder
        self.projection = _check_projection(projection, encoder.config.hidden_size)
        self.tokenizer = tokenizer
        self.settings = settings or MultiVectorSettings()
        self.token_ids = TokenIds.resolve(tokenizer, self.settings) if tokenizer is not None else None

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, dimension: int = DEFAULT_DIMENSION,
                        bias: bool = False, seed: int = 0, allow_pickle: bool = False,
                        **overrides: Any) -> "MultiVectorModel":
        """A PyLate directory (its projection and settings), or a plain HF / sentence-transformers encoder, which
        gets the marker tokens (``add_marker_tokens``) and a new ``dimension``-wide projection initialised as
        PyLate's (``nn.Linear``'s default: uniform in +-1/sqrt(hidden)), from ``seed``. ``overrides``: settings by
        name (``query_length=64``...)."""
        encoder, tokenizer, stored = _load(path, allow_pickle)
        if stored is not None:
            return cls(encoder, [_linear(w, b) for w, b in stored.layers], tokenizer=tokenizer,
                       settings=stored.settings.with_overrides(**overrides))
        if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension <= 0:
            raise InputError(f"dimension must be a positive integer, found {dimension!r}")
        settings = MultiVectorSettings().with_overrides(**overrides)
        add_marker_tokens(encoder, tokenizer, settings)
        projection = nn.Linear(encoder.config.hidden_size, dimension, bias=bias)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            nn.init.kaiming_uniform_(projection.weight, a=math.sqrt(5), generator=generator)
            if bias:
                bound = 1 / math.sqrt(encoder.config.hidden_size)
                nn.init.uniform_(projection.bias, -bound, bound, generator=generator)
        return cls(encoder, projection.to(encoder.embeddings.word.weight.device), tokenizer=tokenizer,
                   settings=settings)

    @property
    def dimension(self) -> int:
        return self.projection[-1].out_features

    def _ids(self) -> TokenIds:
        if self.token_ids is None:
            raise InputError("this MultiVectorModel has no tokenizer; pass tokenizer= or use from_pretrained")
        return self.token_ids

    def tokenize(self, texts: Sequence[str] | str, is_query: bool) -> dict[str, torch.Tensor]:
        """A padded batch (input_ids, attention_mask, token_type_ids) of queries or documents, tokenised as PyLate
        does; with query expansion every query is ``query_length`` tokens long."""
        settings = self.settings
        prompt = settings.prompts.get(settings.default_prompt_name) if settings.default_prompt_name else None
        tokens = tokenize_texts(self.tokenizer, texts, is_query=is_query, settings=settings, ids=self._ids(),
                                model_limit=self.encoder.config.max_sequence_length, prompt=prompt)
        return tokens.padded(self.tokenizer.pad_token_id)

    def is_query_batch(self, input_ids: torch.Tensor) -> bool:
        """Whether a batch holds queries or documents, from the marker after the first token."""
        ids = self._ids()
        if input_ids.shape[1] >= 2:
            second = input_ids[:, 1]
            for marker, answer in ((ids.query_marker, True), (ids.document_marker, False)):
                if marker is not None and bool((second == marker).all()):
                    return answer
        raise InputError("cannot tell queries from documents in this batch (no query or document marker after the "
                         "first token of every row); pass is_query=True or False")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                *, is_query: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch, length) token ids -> ((batch, length, dimension) unit token vectors, zero where the token does
        not count; (batch, length) bool mask of the tokens that count). ``is_query``: None tells from the markers.

        Queries with expansion tokens that are not attended run as a padded grid with those keys masked (the
        encoder's ``attention_bias`` path), so that the expansion tokens get vectors."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise InputError(f"input_ids must be a (batch, length) tensor, found "
                             f"{tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids)}")
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            raise InputError("attention_mask must be a tensor of input_ids' shape "
                             f"{tuple(input_ids.shape)}")
        if is_query is None:
            is_query = self.is_query_batch(input_ids)
        settings = self.settings
        if is_query and settings.do_query_expansion and not settings.attend_to_expansion_tokens:
            length = input_ids.shape[1]
            bias = torch.zeros(1, 1, length, length, device=input_ids.device)
            hidden = self.encoder(input_ids, attention_mask, token_type_ids, attention_bias=bias).last_hidden_state
        else:
            hidden = self.encoder(input_ids, attention_mask, token_type_ids).last_hidden_state
        vectors = _project(self.projection, hidden)
        mask = scoring_mask(input_ids, attention_mask, is_query=is_query, settings=settings,
                            skiplist=self.token_ids.skiplist if self.token_ids is not None else ())
        return vectors * mask[..., None].to(vectors.dtype), mask

    def embed(self, batch: Mapping[str, torch.Tensor], is_query: bool | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """The vectors and mask of a tokenised batch (``tokenize``'s output)."""
        from .sentence_model import batch_features

        return self(**batch_features(batch), is_query=is_query)

    def save_pretrained(self, directory: str | Path, tokenizer: Tokenizer | None = None) -> Path:
        """PyLate's directory: the encoder as an HF model with its tokenizer (markers included), the projection in
        ``1_Dense/`` and the settings in config_sentence_transformers.json. PyLate, sentence-transformers 6
        (``MultiVectorEncoder``) and ``MultiVectorEmbedder.from_pretrained`` read it."""
        tokenizer = tokenizer or self.tokenizer
        if tokenizer is None:
            raise InputError("save_pretrained needs the tokenizer (its vocabulary holds the markers); pass tokenizer=")
        from ..modeling.models import save_model

        directory = Path(directory)
        save_model(self.encoder, directory, tokenizer=tokenizer)
        limit = min(self.settings.document_length, self.encoder.config.max_sequence_length)
        return write_multi_vector_dir(directory, list(self.projection), self.settings, limit)

    def extra_repr(self) -> str:
        s = self.settings
        return (f"dimension={self.dimension}, query_length={s.query_length}, document_length={s.document_length}, "
                f"do_query_expansion={s.do_query_expansion}, attend_to_expansion_tokens={s.attend_to_expansion_tokens}")


__all__ = ["MultiVectorEmbedder", "MultiVectorModel", "MultiVectorSettings", "add_marker_tokens",
           "is_multi_vector_dir", "maxsim", "maxsim_scores", "pad_vectors", "read_multi_vector_dir",
           "write_multi_vector_dir"]
