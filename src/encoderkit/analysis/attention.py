"""Attention analysis: the attention probabilities of every layer and head for a text or a pair, their
heatmaps, per-head statistics in the manner of Clark et al. (2019, "What does BERT look at?"), and what
a causal (left-to-right) mask changes.

The probabilities come from the encoder's explicit attention path (the one ``output_attentions=True``
takes), which the parity tests hold equal to transformers' ``output_attentions``.
"""
from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import InputError
from ..modeling.attention import causal_bias
from ..modeling.encoder import EncoderModel, EncoderOutput
from ..reports import Report, markdown_table, save_figure
from ..tokenizer import Encoded, Tokenizer
from . import plots

MASKS = ("bidirectional", "causal")

# The categories a (query, key) pair falls into, in order of precedence: when a key is both, say, the
# next token and [SEP] (the last word of a sentence), it counts as [SEP]. Special tokens come first
# because attention to them is Clark et al.'s "no-op" signal whatever the query's position; then the
# token itself, then its neighbours. So every key has exactly one category and, per query token, the
# shares add up to the row's total probability: 1.
CATEGORIES = ("cls", "sep", "self", "previous", "next", "punctuation", "other")
CATEGORY_DESCRIPTIONS = {
    "cls": "the first special token ([CLS] / <s>)",
    "sep": "the other special tokens ([SEP] / </s>)",
    "self": "the query token itself",
    "previous": "the token just before the query",
    "next": "the token just after the query",
    "punctuation": "punctuation tokens (not special, not the neighbours above)",
    "other": "everything else",
}


# ---------------------------------------------------------------------------------------------
# Attention maps of one input
# ---------------------------------------------------------------------------------------------
@dataclass
class AttentionMaps(Report):
    """Every layer's and head's attention probabilities for one text (or pair), with its tokens.

    ``probabilities[layer, head, query, key]``: float32, each (query) row sums to 1. Layers and heads
    are numbered from 0.
    """

    text: str
    pair: str | None
    tokens: list[str]
    input_ids: list[int]
    token_type_ids: list[int]
    word_ids: list[int | None]
    sequence_ids: list[int | None]  # 0 for the text, 1 for the pair, None for special tokens
    offsets: list[tuple[int, int]]  # character span of each token in its own sequence
    special_positions: list[int]
    cls_position: int | None  # the first special token when it opens the input ([CLS] / <s>)
    sep_positions: list[int]  # the other special tokens ([SEP] / </s>)
    mask: str  # "bidirectional" or "causal"
    probabilities: np.ndarray  # (layers, heads, length, length)
    # DeBERTa's score terms before the mask and softmax: "c2c" (content to content), "c2p" (content to position),
    # "p2c" (position to content), each (layers, heads, length, length); their sum, masked, softmaxes to
    # ``probabilities``. None for the other families (their scores are content only).
    score_parts: dict[str, np.ndarray] | None = None

    @property
    def num_layers(self) -> int:
        return int(self.probabilities.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.probabilities.shape[1])

    @property
    def length(self) -> int:
        return len(self.tokens)

    def check_layer_head(self, layer: int, head: int | None = None) -> None:
        check_layer_head(layer, head, self.num_layers, self.num_heads)

    def head(self, layer: int, head: int) -> np.ndarray:
        """The (query, key) probabilities of one head."""
        self.check_layer_head(layer, head)
        return self.probabilities[layer, head]

    @property
    def punctuation_positions(self) -> list[int]:
        special = set(self.special_positions)
        return [p for p, token in enumerate(self.tokens) if p not in special and is_punctuation(token)]

    def statistics(self, punctuation: bool = True) -> "HeadStatistics":
        """Head statistics of this one input (see ``head_statistics``)."""
        return head_statistics([self], punctuation=punctuation)

    # ----- figures ----------------------------------------------------------------------------
    def heatmap(self, layer: int, head: int, path: str | Path, max_labels: int = plots.DEFAULT_MAX_LABELS,
                part: str | None = None) -> Path:
        """A PNG of one head with the tokens on both axes: its probabilities, or one DeBERTa score term
        (``part``: "c2c", "c2p" or "p2c", before the softmax)."""
        if part is None:
            matrix = self.head(layer, head)
            title = f"layer {layer}, head {head} ({self.mask} mask; layers and heads from 0)"
            return plots.plot_head(matrix, self.tokens, title, Path(path), max_labels)
        self.check_layer_head(layer, head)
        if not self.score_parts or part not in self.score_parts:
            have = ", ".join(self.score_parts or ()) or "none: this model's scores are content-to-content only"
            raise InputError(f"no {part!r} score part for this model; it has {have}")
        title = f"layer {layer}, head {head}: {part} scores (before softmax; layers and heads from 0)"
        return plots.plot_head(self.score_parts[part][layer, head], self.tokens, title, Path(path), max_labels,
                               label=f"{part} score", diverging=True)

    def grid(self, path: str | Path, layer: int | None = None, highlight_head: int | None = None) -> Path:
        """A PNG of small multiples: all heads of ``layer``, or every layer x head when ``layer`` is None."""
        if layer is None:
            matrices = self.probabilities
            titles = [[f"L{l} H{h}" for h in range(self.num_heads)] for l in range(self.num_layers)]
            suptitle = f"all layers (rows) x heads (columns), {self.mask} mask"
            highlight = None
        else:
            self.check_layer_head(layer, highlight_head)
            cols = min(self.num_heads, 4 if self.num_heads <= 16 else 8)
            rows = math.ceil(self.num_heads / cols)
            length = self.length
            matrices = np.zeros((rows, cols, length, length), dtype=np.float32)
            titles = [["" for _ in range(cols)] for _ in range(rows)]
            for h in range(self.num_heads):
                matrices[h // cols, h % cols] = self.probabilities[layer, h]
                titles[h // cols][h % cols] = f"head {h}"
            suptitle = f"layer {layer}: all {self.num_heads} heads, {self.mask} mask"
            highlight = None if highlight_head is None else (highlight_head // cols, highlight_head % cols)
        return plots.plot_head_grid(matrices, titles, Path(path), suptitle, highlight, self.tokens)

    def figures(self, out_dir: Path) -> list[Path]:
        return [self.grid(out_dir / f"attention_layer{layer}.png", layer) for layer in range(self.num_layers)]

    def markdown(self) -> str:
        rows = [(p, token, "" if s is None else s) for p, (token, s) in enumerate(zip(self.tokens, self.sequence_ids))]
        lines = [f"# Attention maps ({self.mask} mask)", "",
                 f"{self.num_layers} layers x {self.num_heads} heads over {self.length} tokens. "
                 "The JSON holds `probabilities[layer][head][query][key]`.", "",
                 markdown_table(["position", "token", "segment"], rows), "",
                 "## Heads with the strongest link between two words (one link per head)", ""]
        lines.append(markdown_table(["layer", "head", "from", "to", "probability"], self.strongest_links(10)))
        return "\n".join(lines) + "\n"

    def strongest_links(self, count: int = 10) -> list[tuple[int, int, str, str, float]]:
        """The heads with the strongest single link between two different non-special tokens, one link per
        head, strongest first: (layer, head, query token, key token, probability). These are what heads do
        beyond attending to [CLS], [SEP] and themselves (previous-token heads, for instance)."""
        probs = self.probabilities.copy()
        special = self.special_positions
        probs[:, :, special, :] = -1.0
        probs[:, :, :, special] = -1.0
        diagonal = np.arange(self.length)
        probs[:, :, diagonal, diagonal] = -1.0
        flat = probs.reshape(self.num_layers * self.num_heads, -1)
        best = flat.argmax(axis=1)  # each head's strongest (query, key) cell
        links = []
        for index in np.argsort(flat[np.arange(len(best)), best])[::-1][:count]:
            query, key = divmod(int(best[index]), self.length)
            value = float(flat[index, best[index]])
            if value < 0:  # no two different non-special tokens
                break
            links.append((int(index // self.num_heads), int(index % self.num_heads), f"{self.tokens[query]} ({query})",
                          f"{self.tokens[key]} ({key})", value))
        return links


def check_layer_head(layer: int, head: int | None, num_layers: int, num_heads: int) -> None:
    """InputError unless 0 <= layer < num_layers (and 0 <= head < num_heads when a head is given)."""
    if not isinstance(layer, (int, np.integer)) or not 0 <= layer < num_layers:
        raise InputError(f"layer must be between 0 and {num_layers - 1} (the model has {num_layers} layers, "
                         f"numbered from 0), found {layer}")
    if head is not None and (not isinstance(head, (int, np.integer)) or not 0 <= head < num_heads):
        raise InputError(f"head must be between 0 and {num_heads - 1} (each layer has {num_heads} heads, "
                         f"numbered from 0), found {head}")


def is_punctuation(token: str) -> bool:
    """A token made only of Unicode punctuation, after removing sub-word markers (##, Ġ, ▁)."""
    stripped = token.removeprefix("##").lstrip("Ġ▁")
    return bool(stripped) and all(unicodedata.category(ch).startswith("P") for ch in stripped)


# ---------------------------------------------------------------------------------------------
# The analyzer
# ---------------------------------------------------------------------------------------------
class AttentionAnalyzer:
    """Runs a model on texts and returns its attention maps (any of the five families).

    ``model`` may be the bare encoder or any task model (its encoder is used). It is put in eval mode:
    dropout on the attention probabilities would change them.
    """

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, *, batch_size: int = 16,
                 max_length: int | None = None) -> None:
        encoder = model if isinstance(model, EncoderModel) else getattr(model, "encoder", None)
        if not isinstance(encoder, EncoderModel):
            raise InputError(f"attention analysis needs an encoderkit model, found {type(model).__name__}")
        if batch_size <= 0:
            raise InputError(f"batch_size must be positive, found {batch_size}")
        self.encoder = encoder.eval()
        self.tokenizer = tokenizer
        self.config = encoder.config
        self.batch_size = batch_size
        # Positions beyond the table would fail in the embeddings; RoBERTa's table holds 2 more (pad offset).
        position_limit = self.config.max_position_embeddings - (self.config.padding_position_id + 1
                                                                  if self.config.family.positions_from_padding else 0)
        self.max_length = min(max_length or tokenizer.model_max_length, position_limit)

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, **kwargs) -> "AttentionAnalyzer":
        """The analyzer of a model directory (HF format or sentence-transformers; None = the default model)."""
        from ..modeling.models import load_model
        from ..io.hub import resolve_model

        resolved = resolve_model(path)
        return cls(load_model(resolved, task="base"), Tokenizer.from_pretrained(resolved.tokenizer_dir), **kwargs)

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.config.num_attention_heads

    def check_layer_head(self, layer: int, head: int | None = None) -> None:
        check_layer_head(layer, head, self.num_layers, self.num_heads)

    # ----- running the model ------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
                mask: str = "bidirectional") -> tuple[EncoderOutput, list[Encoded], torch.Tensor]:
        """One padded batch through the encoder with attentions and hidden states.

        Returns the output, each input's encoding and the attention mask (batch, length).
        """
        if mask not in MASKS:
            raise InputError(f"mask must be one of {MASKS}, found {mask!r}")
        for index, text in enumerate(texts):
            _check_nonempty(text, "text" if len(texts) == 1 else f"text {index}")
        for index, pair in enumerate(pairs or ()):
            _check_nonempty(pair, "pair" if len(pairs) == 1 else f"pair {index}")
        batch = self.tokenizer.encode_batch(list(texts), None if pairs is None else list(pairs),
                                            max_length=self.max_length)
        # Token types only where the model has more than one segment embedding (RoBERTa has one, DistilBERT none).
        types = batch.token_type_ids if self.config.type_vocab_size > 1 else None
        dtype = self.encoder.embeddings.word.weight.dtype
        bias = causal_bias(batch.input_ids.shape[1], dtype) if mask == "causal" else None
        output = self.encoder(batch.input_ids, batch.attention_mask, types, output_hidden_states=True,
                              output_attentions=True, attention_bias=bias,
                              output_score_parts=self.config.relative_attention)
        return output, batch.encodings, batch.attention_mask

    def attend(self, text: str, pair: str | None = None, *, mask: str = "bidirectional") -> AttentionMaps:
        """The attention maps of one text, or of a text pair."""
        return next(self.iter_attend([text], None if pair is None else [pair], mask=mask))

    def attend_many(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                    mask: str = "bidirectional") -> list[AttentionMaps]:
        """The attention maps of many texts (or pairs), in input order."""
        return list(self.iter_attend(texts, pairs, mask=mask))

    def iter_attend(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                    mask: str = "bidirectional", in_order: bool = True) -> Iterator[AttentionMaps]:
        """The attention maps of many inputs, one batch in memory at a time (for corpus statistics).

        ``in_order=False`` batches inputs of similar length together (shortest first), which wastes far less
        compute on padding; each map still carries its text.
        """
        if isinstance(texts, str):
            raise InputError("expected a list of texts; for one text use attend()")
        if pairs is not None and len(pairs) != len(texts):
            raise InputError(f"got {len(texts)} texts but {len(pairs)} pairs; give one pair per text")
        if len(texts) == 0:
            raise InputError("no texts given")
        if not in_order:  # characters are a good enough proxy for tokens to group by length
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]) + (len(pairs[i]) if pairs else 0))
            texts = [texts[i] for i in order]
            pairs = None if pairs is None else [pairs[i] for i in order]
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start:start + self.batch_size]
            pair_chunk = None if pairs is None else pairs[start:start + self.batch_size]
            output, encodings, attention_mask = self.forward(chunk, pair_chunk, mask)
            stacked = torch.stack(output.attentions, dim=1).float()  # (batch, layers, heads, length, length)
            parts = None
            if output.score_parts and output.score_parts[0]:
                parts = {name: torch.stack([layer[name] for layer in output.score_parts], dim=1).float()
                         for name in output.score_parts[0]}
            for row, encoding in enumerate(encodings):
                length = int(attention_mask[row].sum())
                maps = _maps_from(encoding, length, chunk[row], None if pair_chunk is None else pair_chunk[row],
                                  mask, stacked[row, :, :, :length, :length].numpy())
                if parts is not None:
                    maps.score_parts = {name: np.ascontiguousarray(value[row, :, :, :length, :length].numpy())
                                        for name, value in parts.items()}
                yield maps

    # ----- analyses ---------------------------------------------------------------------------
    def head_statistics(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                        punctuation: bool = True, mask: str = "bidirectional") -> "HeadStatistics":
        """Per-head attention shares and entropy over a corpus, averaged over tokens, then texts."""
        return head_statistics(self.iter_attend(texts, pairs, mask=mask, in_order=False), punctuation=punctuation)

    def compare_masks(self, text: str, pair: str | None = None, *, layer: int = 0, head: int = 0) -> "MaskComparison":
        """The same input under the usual bidirectional mask and under a causal one."""
        self.check_layer_head(layer, head)
        runs = {}
        for mask in MASKS:
            output, encodings, _ = self.forward([text], None if pair is None else [pair], mask)
            runs[mask] = (output, encodings[0])
        (both, encoding), (causal, _) = runs["bidirectional"], runs["causal"]
        final_both, final_causal = both.last_hidden_state[0].float(), causal.last_hidden_state[0].float()
        token_cosine = torch.nn.functional.cosine_similarity(final_both, final_causal, dim=-1)
        mean_cosine = torch.nn.functional.cosine_similarity(final_both.mean(0), final_causal.mean(0), dim=0)
        causal_map = causal.attentions[layer][0, head].float().numpy()
        return MaskComparison(
            text=text, pair=pair, tokens=list(encoding.tokens), layer=layer, head=head,
            bidirectional=both.attentions[layer][0, head].float().numpy(), causal=causal_map,
            causal_mass_above_diagonal=float(np.triu(causal_map, 1).sum()),
            first_token_cosine=float(token_cosine[0]), mean_pooled_cosine=float(mean_cosine),
            token_cosine=token_cosine.tolist(),
        )


def _check_nonempty(text: object, what: str) -> None:
    if not isinstance(text, str):
        raise InputError(f"{what} must be a string, found {type(text).__name__}")
    if not text.strip():
        raise InputError(f"{what} is empty; give some text to analyse")


def _maps_from(encoding: Encoded, length: int, text: str, pair: str | None, mask: str,
               probabilities: np.ndarray) -> AttentionMaps:
    special = [p for p in range(length) if encoding.special_tokens_mask[p]]
    cls_position = 0 if special and special[0] == 0 else None
    return AttentionMaps(
        text=text, pair=pair, tokens=encoding.tokens[:length], input_ids=encoding.input_ids[:length],
        token_type_ids=encoding.token_type_ids[:length], word_ids=encoding.word_ids[:length],
        sequence_ids=encoding.sequence_ids[:length], offsets=[tuple(o) for o in encoding.offsets[:length]],
        special_positions=special, cls_position=cls_position,
        sep_positions=[p for p in special if p != cls_position], mask=mask,
        probabilities=np.ascontiguousarray(probabilities, dtype=np.float32),
    )


# ---------------------------------------------------------------------------------------------
# Head statistics
# ---------------------------------------------------------------------------------------------
def key_categories(length: int, cls_position: int | None, sep_positions: Iterable[int],
                   punctuation_positions: Iterable[int] = ()) -> np.ndarray:
    """The category (an index into ``CATEGORIES``) of every (query, key) pair: a (length, length) array.

    Categories are written from the lowest precedence to the highest, so where two apply the one with
    the higher precedence (earlier in ``CATEGORIES``) remains.
    """
    index = {name: i for i, name in enumerate(CATEGORIES)}
    categories = np.full((length, length), index["other"], dtype=np.int64)
    categories[:, list(punctuation_positions)] = index["punctuation"]
    positions = np.arange(length)
    categories[positions[:-1], positions[:-1] + 1] = index["next"]
    categories[positions[1:], positions[1:] - 1] = index["previous"]
    categories[positions, positions] = index["self"]
    categories[:, list(sep_positions)] = index["sep"]
    if cls_position is not None:
        categories[:, cls_position] = index["cls"]
    return categories


def attention_shares(probabilities: np.ndarray, categories: np.ndarray) -> np.ndarray:
    """For each query row, the probability mass on the keys of each category.

    ``probabilities``: (..., queries, keys); returns (..., len(CATEGORIES), queries). Along the category
    axis the shares add up to each row's total, 1 for attention.
    """
    one_hot = (categories[None, :, :] == np.arange(len(CATEGORIES))[:, None, None]).astype(np.float64)
    return np.einsum("...qk,cqk->...cq", probabilities.astype(np.float64), one_hot)


def attention_entropy(probabilities: np.ndarray) -> np.ndarray:
    """Entropy in nats, -sum_k p log p (0 log 0 = 0), of each attention row: (..., queries, keys) -> (..., queries)."""
    p = probabilities.astype(np.float64)
    logs = np.log(np.where(p > 0, p, 1.0))
    return -(p * logs).sum(axis=-1)


@dataclass
class HeadStatistics(Report):
    """Where each head attends, averaged over the query tokens of a text, then over texts.

    ``shares[category]`` and ``entropy`` are (layers, heads) arrays; for every head the shares of the
    categories add up to 1 (see ``CATEGORIES`` for their precedence).
    """

    num_texts: int
    num_layers: int
    num_heads: int
    mean_tokens: float
    categories: list[str]
    shares: dict[str, np.ndarray]  # category -> (layers, heads)
    entropy: np.ndarray  # (layers, heads), nats
    uniform_entropy: float  # mean over texts of log(length): the entropy of attending to every token alike
    category_descriptions: dict[str, str] = field(default_factory=lambda: dict(CATEGORY_DESCRIPTIONS))

    def share(self, category: str) -> np.ndarray:
        if category not in self.shares:
            raise InputError(f"unknown category {category!r}; choose one of {', '.join(self.shares)}")
        return self.shares[category]

    def top_heads(self, category: str, count: int = 3) -> list[tuple[int, int, float]]:
        """The ``count`` heads with the largest share of ``category`` (or "entropy"): (layer, head, value)."""
        values = self.entropy if category == "entropy" else self.share(category)
        order = np.argsort(values, axis=None)[::-1][:count]
        return [(int(i // self.num_heads), int(i % self.num_heads), float(values.flat[i])) for i in order]

    def markdown(self) -> str:
        lines = [
            "# Attention head statistics", "",
            f"{self.num_texts} text(s), {self.mean_tokens:.1f} tokens on average; {self.num_layers} layers x "
            f"{self.num_heads} heads (numbered from 0). Each share is the attention a query token gives to keys "
            "of that kind, averaged over the tokens of a text, then over texts. A key of two kinds counts as the "
            "first in this order (so the shares add up to 1):", "",
        ]
        lines += [f"- **{name}**: {self.category_descriptions.get(name, name)}" for name in self.categories]
        lines += ["", f"Entropy is in nats; attending to every token alike would give {self.uniform_entropy:.3f}.", "",
                  "## Heads with the largest share", ""]
        rows = []
        for name in [*self.categories, "entropy"]:
            best = self.top_heads(name)
            rows.append([name, ", ".join(f"{layer}-{head} ({value:.2f})" for layer, head, value in best)])
        lines += [markdown_table(["category", "layer-head (share)"], rows), "", "## Every head", ""]
        table_rows = []
        for layer in range(self.num_layers):
            for head in range(self.num_heads):
                table_rows.append([layer, head, *(float(self.shares[c][layer, head]) for c in self.categories),
                                   float(self.entropy[layer, head])])
        lines.append(markdown_table(["layer", "head", *self.categories, "entropy"], table_rows))
        return "\n".join(lines) + "\n"

    def figures(self, out_dir: Path) -> list[Path]:
        panels = {name: self.shares[name] for name in self.categories}
        panels["entropy (nats)"] = self.entropy
        path = plots.plot_layer_head_maps(panels, out_dir / "head_statistics.png",
                                          f"attention shares per head ({self.num_texts} text(s))")
        return [path]


def head_statistics(maps: Iterable[AttentionMaps], punctuation: bool = True) -> HeadStatistics:
    """Per-head shares of attention to each category and mean entropy, over one or many inputs.

    For each input: the shares and the entropy of every query row, averaged over its real tokens; then
    the mean over inputs (so a long text counts as much as a short one, as in Clark et al.).
    ``punctuation=False`` folds the punctuation category into "other".
    """
    share_sum: np.ndarray | None = None
    entropy_sum: np.ndarray | None = None
    count, tokens, uniform = 0, 0, 0.0
    for item in maps:
        categories = key_categories(item.length, item.cls_position, item.sep_positions,
                                    item.punctuation_positions if punctuation else ())
        shares = attention_shares(item.probabilities, categories).mean(axis=-1)  # (layers, heads, categories)
        entropy = attention_entropy(item.probabilities).mean(axis=-1)  # (layers, heads)
        share_sum = shares if share_sum is None else share_sum + shares
        entropy_sum = entropy if entropy_sum is None else entropy_sum + entropy
        count += 1
        tokens += item.length
        uniform += math.log(item.length)
    if share_sum is None or entropy_sum is None:
        raise InputError("head statistics need at least one text")
    names = [c for c in CATEGORIES if punctuation or c != "punctuation"]
    layers, heads = entropy_sum.shape
    return HeadStatistics(
        num_texts=count, num_layers=layers, num_heads=heads, mean_tokens=tokens / count, categories=names,
        shares={name: share_sum[:, :, CATEGORIES.index(name)] / count for name in names},
        entropy=entropy_sum / count, uniform_entropy=uniform / count,
        category_descriptions={name: CATEGORY_DESCRIPTIONS[name] for name in names},
    )


# ---------------------------------------------------------------------------------------------
# Bidirectional vs causal mask
# ---------------------------------------------------------------------------------------------
@dataclass
class MaskComparison(Report):
    """One input under the encoder's own (bidirectional) mask and under a causal mask.

    Cosines compare the final-layer vectors of the two runs: per token, for the first token ([CLS],
    the pooler's input) and for the mean over tokens (mean pooling, as sentence embedders do).
    """

    text: str
    pair: str | None
    tokens: list[str]
    layer: int
    head: int
    bidirectional: np.ndarray  # (length, length) probabilities of the chosen head
    causal: np.ndarray
    causal_mass_above_diagonal: float  # attention to later tokens under the causal mask: 0
    first_token_cosine: float
    mean_pooled_cosine: float
    token_cosine: list[float]

    def markdown(self) -> str:
        rows = [(p, token, cos) for p, (token, cos) in enumerate(zip(self.tokens, self.token_cosine))]
        return "\n".join([
            "# Bidirectional vs causal attention mask", "",
            f"Layer {self.layer}, head {self.head} (from 0), {len(self.tokens)} tokens. Under the causal mask a "
            "token sees only itself and the tokens before it; the attention it would give to later tokens is "
            f"{self.causal_mass_above_diagonal:.3g}. Final-layer cosine similarity between the two runs: "
            f"first token {self.first_token_cosine:.4f}, mean-pooled {self.mean_pooled_cosine:.4f}.", "",
            markdown_table(["position", "token", "cosine (final layer)"], rows),
        ]) + "\n"

    def figures(self, out_dir: Path) -> list[Path]:
        return [self.plot(out_dir / "mask_comparison.png")]

    def plot(self, path: str | Path, max_labels: int = plots.DEFAULT_MAX_LABELS) -> Path:
        """Side-by-side heatmaps of the head under both masks, and the per-token cosine of the final vectors."""
        length = len(self.tokens)
        side = min(9.0, max(3.8, 2.2 + 0.14 * min(length, max_labels)))
        figure, axes = plots.subplots(1, 3, side * 3, side, gridspec_kw={"width_ratios": [1, 1, 0.8]})
        top = max(float(self.bidirectional.max()), float(self.causal.max()))  # one scale: the maps compare
        image = plots.draw_attention(axes[0, 0], self.bidirectional, self.tokens,
                                     f"bidirectional: layer {self.layer}, head {self.head}", max_labels, top)
        plots.draw_attention(axes[0, 1], self.causal, self.tokens,
                             f"causal: layer {self.layer}, head {self.head}", max_labels, top)
        figure.colorbar(image, ax=axes[0, 1], fraction=0.046, pad=0.04, label="attention probability")
        bars = axes[0, 2]
        positions = np.arange(length)
        bars.barh(positions, self.token_cosine, color="tab:blue")
        bars.set_ylim(length - 0.5, -0.5)
        ticks, labels = plots.thinned_labels(self.tokens, max_labels)
        bars.set_yticks(ticks, labels, fontsize=8 if len(ticks) <= 30 else 6)
        bars.set_xlim(min(0.0, min(self.token_cosine)), 1.0)
        bars.set_xlabel("cosine(final vector, bidirectional vs causal)", fontsize=8)
        bars.set_title(f"first token {self.first_token_cosine:.3f}, mean-pooled {self.mean_pooled_cosine:.3f}",
                       fontsize=9)
        return save_figure(figure, Path(path))
