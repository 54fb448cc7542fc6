"""Named-entity recognition (token classification): tags per word, grouped into entities with type,
score and character offsets.

Words are the tokenizer's words (its pre-tokenizer splits on spaces and punctuation, as
transformers' token-classification pipeline treats WordPiece words), or the words the caller gives
(``tag_words``, e.g. CoNLL tokens). A word's tag comes from its sub-tokens by ``aggregation``:
"first" (the first sub-token's distribution, how the model was trained), "average" (the mean of the
sub-tokens' distributions) or "max" (the distribution of the sub-token with the single most confident
label). With a CRF the words' tags are the Viterbi path and their scores the CRF's marginal
probabilities. Texts longer than ``max_length`` are read in overlapping windows; each token's scores
come from the window in which it has the most context on both sides.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import InputError
from .pipeline import TaskPipeline, softmax, split_packed

AGGREGATIONS = ("first", "average", "max")


@dataclass
class Entity:
    type: str
    text: str
    start: int  # character offsets in the input text: text[start:end]
    end: int
    score: float  # mean of the words' tag probabilities


@dataclass
class TaggedWords:
    words: list[str]
    tags: list[str]
    scores: list[float]  # probability of each word's tag (NaN for a word the tokenizer dropped entirely)


@dataclass
class _Word:
    start: int
    end: int
    rows: list[np.ndarray]  # one score row per sub-token, in order


class EntityRecognizer(TaskPipeline):
    tasks = ("token-classification",)

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, aggregation: str = "first",
                 stride: int | None = None, **options: Any) -> None:
        super().__init__(model, tokenizer, **options)
        self.aggregation = _check_aggregation(aggregation)
        self.stride = stride if stride is not None else self.max_length // 4
        if not 0 <= self.stride < self.max_length - 2:
            raise InputError(f"stride must be between 0 and max_length - 3 ({self.max_length - 3}), found {self.stride}")
        self.labels = self.config.labels

    def __call__(self, texts: str | Sequence[str], *, aggregation: str | None = None) -> list[Entity] | list[list[Entity]]:
        """Entities of each text (a list for one text, a list of lists for several)."""
        single = isinstance(texts, str)
        batch = [texts] if single else list(texts)
        results = []
        for text, words in zip(batch, self._words(batch, False)):
            tags, scores = self._tags(words, aggregation or self.aggregation)
            results.append(group_entities(text, words, tags, scores))
        return results[0] if single else results

    def tag_words(self, sentences: Sequence[Sequence[str]], *, aggregation: str | None = None) -> list[TaggedWords]:
        """A tag for every given word (words the tokenizer drops entirely get "O")."""
        results = []
        for sentence, words in zip(sentences, self._words(sentences, True)):
            tags, scores = self._tags(words, aggregation or self.aggregation)
            by_index = {w.start: (tag, score) for w, tag, score in zip(words, tags, scores)}
            pairs = [by_index.get(i, ("O", float("nan"))) for i in range(len(sentence))]
            results.append(TaggedWords(list(sentence), [p[0] for p in pairs], [p[1] for p in pairs]))
        return results

    # ----- internals -----------------------------------------------------------------------------
    def _words(self, inputs: Sequence[Any], pretokenized: bool) -> list[list[_Word]]:
        """Each input's words with their sub-tokens' logits, windows merged. For given word lists a word's
        (start, end) is (index, index + 1); for texts it is its character span."""
        if isinstance(inputs, str):
            raise InputError("pass a list of texts (or, for tag_words, a list of word lists)")
        if not inputs:
            return []
        encodings = self.tokenizer.encode_raw(inputs, max_length=self.max_length, stride=self.stride,
                                              is_pretokenized=pretokenized)
        windows = [(i, w) for i, e in enumerate(encodings) for w in [e, *e.overflowing]]
        ids, types = [w.ids for _, w in windows], [w.type_ids for _, w in windows]
        window_logits: list[np.ndarray | None] = [None] * len(windows)
        with torch.inference_mode():
            for indices, hidden, batch in self._encode(ids, types):
                for index, states in zip(indices, split_packed(hidden, batch)):
                    window_logits[index] = self.model.token_classifier(states).float().cpu().numpy()
        # token (word, start offset) -> (context on its narrower side, word, offsets, logits row)
        best: list[dict[tuple[int, int], tuple[int, int, tuple[int, int], np.ndarray]]] = [{} for _ in inputs]
        for (text_index, window), logits in zip(windows, window_logits):
            content = [p for p, w in enumerate(window.word_ids) if w is not None]
            if not content:
                continue
            first, last = content[0], content[-1]
            for position in content:
                word, offsets = window.word_ids[position], tuple(window.offsets[position])
                context = min(position - first, last - position)
                key = (word, offsets[0], offsets[1])
                if key not in best[text_index] or best[text_index][key][0] < context:
                    best[text_index][key] = (context, word, offsets, logits[position])
        results = []
        for tokens in best:
            words: dict[int, _Word] = {}
            for key in sorted(tokens):
                _, word, (start, end), row = tokens[key]
                if word not in words:
                    words[word] = _Word(word if pretokenized else start, word + 1 if pretokenized else end, [])
                entry = words[word]
                entry.rows.append(row)
                if not pretokenized:
                    entry.end = max(entry.end, end)
            results.append([words[k] for k in sorted(words)])
        return results

    def _tags(self, words: list[_Word], aggregation: str) -> tuple[list[str], list[float]]:
        if not words:
            return [], []
        crf = self.model.crf
        if crf is not None:  # the CRF scores whole words: their first sub-token's emissions
            device = crf.transitions.device
            emissions = torch.from_numpy(np.stack([w.rows[0] for w in words]))[None].to(device)
            mask = torch.ones(1, len(words), dtype=torch.bool, device=device)
            with torch.inference_mode():
                path = crf.decode(emissions, mask)[0]
                marginals = crf.marginals(emissions, mask)[0].cpu().numpy()
            return [self.labels[t] for t in path], [float(marginals[i, t]) for i, t in enumerate(path)]
        distributions = []
        for word in words:
            probabilities = softmax(np.stack(word.rows))
            if aggregation == "first":
                distributions.append(probabilities[0])
            elif aggregation == "average":
                distributions.append(probabilities.mean(axis=0))
            else:
                distributions.append(probabilities[int(probabilities.max(axis=1).argmax())])
        chosen = [int(d.argmax()) for d in distributions]
        return [self.labels[c] for c in chosen], [float(d[c]) for d, c in zip(distributions, chosen)]


def _check_aggregation(name: str) -> str:
    if name not in AGGREGATIONS:
        raise InputError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, found {name!r}")
    return name


def split_tag(tag: str) -> tuple[str, str]:
    """("B"|"I"|"O", type); a tag without a B-/I- prefix counts as I- of itself (as transformers reads it)."""
    if tag == "O":
        return "O", ""
    if len(tag) > 2 and tag[1] == "-" and tag[0] in "BIES":
        return ("B" if tag[0] in "BS" else "I"), tag[2:]
    return "I", tag


def group_entities(text: str, words: Sequence[_Word], tags: Sequence[str], scores: Sequence[float]) -> list[Entity]:
    """Adjacent words of one type form an entity; a B- tag, an O or a change of type ends it."""
    entities: list[Entity] = []
    current: list[int] = []
    current_type = ""

    def close() -> None:
        if current:
            start, end = words[current[0]].start, words[current[-1]].end
            entities.append(Entity(current_type, text[start:end], start, end,
                                   float(np.mean([scores[i] for i in current]))))

    for index, tag in enumerate(tags):
        prefix, kind = split_tag(tag)
        if prefix == "O" or prefix == "B" or kind != current_type:
            close()
            current, current_type = [], ""
        if prefix != "O":
            current.append(index)
            current_type = kind
    close()
    return entities
