"""Heads that link a pronoun to its antecedent (Clark et al. 2019's coreference probe, on sentences you give).

For each example the pronoun's attention row (averaged over its sub-tokens) is read in every head:
- its attention to the antecedent (summed over the antecedent's sub-tokens), against chance: the share
  the antecedent's tokens would get from uniform attention;
- whether the word it attends to most (special tokens, punctuation and the pronoun itself left out) is
  the antecedent: averaged over examples, the head's accuracy, against the chance of picking a word at
  random;
- where the example lists other candidates (distractors), whether the antecedent gets more attention
  than each of them, against 1 / candidates and against the nearest candidate to the pronoun.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence, Union

import numpy as np

from ..errors import DataError, InputError
from ..reports import Report, markdown_table
from . import plots
from .attention import AttentionAnalyzer, AttentionMaps, is_punctuation

# A mention: the word(s) as they appear in the sentence, a character offset inside the word, or a
# (start, end) character span.
Mention = Union[str, int, tuple[int, int]]
RANKINGS = ("accuracy", "attention", "candidate_accuracy")


@dataclass(frozen=True)
class CoreferenceExample:
    """A sentence, a pronoun in it, its antecedent and (optionally) other candidate antecedents.

    A mention given as text matches whole words; ``*_occurrence`` picks the n-th match (from 1) when
    the word repeats. Distractors given as text take their first occurrence (give a span otherwise).
    """

    sentence: str
    pronoun: Mention
    antecedent: Mention
    distractors: tuple[Mention, ...] = ()
    pronoun_occurrence: int = 1
    antecedent_occurrence: int = 1

    @classmethod
    def coerce(cls, value: Any) -> "CoreferenceExample":
        """An example from an example, a dict (the JSONL fields) or a tuple
        (sentence, pronoun, antecedent[, distractors])."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls.from_dict(value)
        if isinstance(value, (tuple, list)) and len(value) in (3, 4):
            distractors = tuple(value[3]) if len(value) == 4 else ()
            return cls(value[0], _mention(value[1]), _mention(value[2]), tuple(_mention(d) for d in distractors))
        raise InputError("an example is a CoreferenceExample, a dict with sentence/pronoun/antecedent, or a "
                         f"(sentence, pronoun, antecedent[, distractors]) tuple; found {value!r}")

    @classmethod
    def from_dict(cls, record: dict) -> "CoreferenceExample":
        missing = [key for key in ("sentence", "pronoun", "antecedent") if key not in record]
        if missing:
            raise InputError(f"a coreference example needs the keys sentence, pronoun and antecedent; "
                             f"{', '.join(missing)} missing in {record!r}")
        distractors = record.get("distractors") or ()
        if isinstance(distractors, str):
            distractors = (distractors,)
        return cls(record["sentence"], _mention(record["pronoun"]), _mention(record["antecedent"]),
                   tuple(_mention(d) for d in distractors), int(record.get("pronoun_occurrence", 1)),
                   int(record.get("antecedent_occurrence", 1)))


def _mention(value: Any) -> Mention:
    if isinstance(value, (list, tuple)) and len(value) == 2:  # JSON has no tuples: [start, end]
        return int(value[0]), int(value[1])
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return value
    raise InputError(f"a mention is a word, a character offset or a [start, end] span; found {value!r}")


def read_coreference_examples(path: str | Path) -> list[CoreferenceExample]:
    """Examples from a JSONL file: one object per line with sentence, pronoun, antecedent and optionally
    distractors, pronoun_occurrence, antecedent_occurrence."""
    from ..data.readers import json_objects

    path = Path(path)
    examples = []
    for number, record in json_objects(path):
        try:
            examples.append(CoreferenceExample.from_dict(record))
        except InputError as exc:
            raise DataError(f"{path}:{number}: {exc}") from exc
    if not examples:
        raise DataError(f"{path} holds no examples")
    return examples


def resolve_span(sentence: str, mention: Mention, occurrence: int = 1) -> tuple[int, int]:
    """The (start, end) character span of a mention in ``sentence``.

    Text matches whole words, case-sensitively first and then ignoring case; an int is an offset inside
    a word (the whole word is taken); a tuple is taken as it is, after a range check.
    """
    if isinstance(mention, tuple):
        start, end = mention
        if not 0 <= start < end <= len(sentence):
            raise InputError(f"span {mention} is not inside the sentence (0..{len(sentence)}): {sentence!r}")
        return start, end
    if isinstance(mention, int):
        if not 0 <= mention < len(sentence) or not re.match(r"\w", sentence[mention]):
            raise InputError(f"character offset {mention} is not inside a word of {sentence!r}")
        start = mention
        while start > 0 and re.match(r"\w", sentence[start - 1]):
            start -= 1
        end = re.compile(r"\w*").match(sentence, mention).end()
        return start, end
    if not mention.strip():
        raise InputError("a mention is empty")
    if occurrence < 1:
        raise InputError(f"occurrences count from 1, found {occurrence}")
    pattern = r"(?<!\w)" + re.escape(mention.strip()) + r"(?!\w)"
    matches = list(re.finditer(pattern, sentence)) or list(re.finditer(pattern, sentence, re.IGNORECASE))
    if len(matches) < occurrence:
        found = f"only {len(matches)} time(s)" if matches else "not at all"
        raise InputError(f"{mention!r} occurs {found} as a whole word in {sentence!r} (occurrence {occurrence} asked)")
    return matches[occurrence - 1].span()


def span_positions(maps: AttentionMaps, span: tuple[int, int], what: str) -> list[int]:
    """Token positions of the first sequence whose character offsets overlap ``span``."""
    start, end = span
    positions = [p for p, (sequence, (a, b)) in enumerate(zip(maps.sequence_ids, maps.offsets))
                 if sequence == 0 and a < end and b > start]
    if not positions:
        raise InputError(f"the {what} at characters {start}..{end} has no tokens (was the sentence truncated?)")
    return positions


def word_groups(maps: AttentionMaps) -> list[list[int]]:
    """The token positions of each word of the first sequence, in order (sub-words grouped by word id)."""
    groups: dict[int, list[int]] = {}
    for position, (sequence, word) in enumerate(zip(maps.sequence_ids, maps.word_ids)):
        if sequence == 0 and word is not None:
            groups.setdefault(word, []).append(position)
    return list(groups.values())


@dataclass
class _ExampleScores:
    to_antecedent: np.ndarray  # (layers, heads)
    hit: np.ndarray  # (layers, heads) bool: the most-attended word is (part of) the antecedent
    predicted_word: np.ndarray  # (layers, heads) index into words
    words: list[str]
    chance_attention: float
    chance_accuracy: float
    to_distractors: np.ndarray | None  # (layers, heads, distractors)
    nearest_is_antecedent: bool | None


def score_example(maps: AttentionMaps, example: CoreferenceExample) -> _ExampleScores:
    """Every head's scores on one example (see the module doc)."""
    sentence = example.sentence
    pronoun = span_positions(maps, resolve_span(sentence, example.pronoun, example.pronoun_occurrence), "pronoun")
    antecedent_span = resolve_span(sentence, example.antecedent, example.antecedent_occurrence)
    antecedent = span_positions(maps, antecedent_span, "antecedent")
    if set(pronoun) & set(antecedent):
        raise InputError(f"the pronoun and the antecedent share tokens in {sentence!r}; give separate words")
    # The pronoun's attention row, averaged over its sub-tokens: (layers, heads, keys).
    row = maps.probabilities[:, :, pronoun, :].astype(np.float64).mean(axis=2)
    to_antecedent = row[:, :, antecedent].sum(axis=-1)

    candidates = [group for group in word_groups(maps)
                  if not set(group) & set(pronoun) and not all(is_punctuation(maps.tokens[p]) for p in group)]
    if not candidates:
        raise InputError(f"{sentence!r} has no word besides the pronoun to attend to")
    word_scores = np.stack([row[:, :, group].sum(axis=-1) for group in candidates], axis=-1)
    is_antecedent = np.array([bool(set(group) & set(antecedent)) for group in candidates])
    predicted = word_scores.argmax(axis=-1)
    words = [sentence[maps.offsets[group[0]][0]:maps.offsets[group[-1]][1]] for group in candidates]

    to_distractors, nearest = None, None
    if example.distractors:
        spans = [resolve_span(sentence, d) for d in example.distractors]
        groups = [span_positions(maps, span, "distractor") for span in spans]
        to_distractors = np.stack([row[:, :, group].sum(axis=-1) for group in groups], axis=-1)
        pronoun_start = resolve_span(sentence, example.pronoun, example.pronoun_occurrence)[0]
        # The nearest candidate before the pronoun (after it, if none is before): a recency baseline.
        def distance(span: tuple[int, int]) -> tuple[int, int]:
            return (0, pronoun_start - span[1]) if span[1] <= pronoun_start else (1, span[0] - pronoun_start)
        nearest = min([antecedent_span, *spans], key=distance) == antecedent_span
    return _ExampleScores(
        to_antecedent=to_antecedent, hit=is_antecedent[predicted], predicted_word=predicted, words=words,
        chance_attention=len(antecedent) / maps.length, chance_accuracy=float(is_antecedent.mean()),
        to_distractors=to_distractors, nearest_is_antecedent=nearest,
    )


@dataclass
class HeadScore:
    layer: int
    head: int
    accuracy: float  # share of examples whose most-attended word is the antecedent
    mean_attention: float  # mean attention from the pronoun to the antecedent
    attention_lift: float  # mean_attention / chance attention
    candidate_accuracy: float | None  # share of examples (with distractors) where the antecedent beats them all
    distractor_attention: float | None  # mean attention from the pronoun to a distractor


@dataclass
class AntecedentHeads(Report):
    """Heads ranked by how they link pronouns to antecedents over a set of examples (layers, heads from 0)."""

    num_examples: int
    num_layers: int
    num_heads: int
    rank_by: str
    top: list[HeadScore]
    chance_attention: float  # mean share of the antecedent's tokens among all tokens (uniform attention)
    chance_accuracy: float  # mean probability of picking the antecedent among the candidate words at random
    examples_with_distractors: int
    candidate_chance: float | None  # mean 1 / (1 + distractors)
    nearest_candidate_accuracy: float | None  # recency baseline: the candidate nearest before the pronoun
    accuracy: np.ndarray  # (layers, heads)
    mean_attention: np.ndarray  # (layers, heads)
    candidate_accuracy: np.ndarray | None  # (layers, heads)
    best_head_predictions: list[dict]  # per example: the best head's most-attended word and whether it is right

    def markdown(self) -> str:
        lines = [
            "# Pronoun-antecedent heads", "",
            f"{self.num_examples} example(s), {self.num_layers} layers x {self.num_heads} heads (from 0), "
            f"ranked by {self.rank_by}. The pronoun's attention is averaged over its sub-tokens and summed over "
            "the antecedent's.", "",
            f"Baselines: uniform attention gives the antecedent {self.chance_attention:.3f}; a random word is the "
            f"antecedent {100 * self.chance_accuracy:.1f}% of the time.",
        ]
        if self.candidate_chance is not None:
            lines.append(f"On the {self.examples_with_distractors} example(s) with distractors: a random candidate is "
                         f"right {100 * self.candidate_chance:.1f}% of the time, the candidate nearest before the "
                         f"pronoun {100 * (self.nearest_candidate_accuracy or 0):.1f}%.")
        rows = [[s.layer, s.head, s.accuracy, s.mean_attention, s.attention_lift,
                 "" if s.candidate_accuracy is None else s.candidate_accuracy,
                 "" if s.distractor_attention is None else s.distractor_attention] for s in self.top]
        lines += ["", markdown_table(["layer", "head", "accuracy", "attention to antecedent", "x chance",
                                      "candidate accuracy", "attention to distractor"], rows)]
        if self.top:
            best = self.top[0]
            lines += ["", f"## What head {best.layer}-{best.head} attends to most", ""]
            lines.append(markdown_table(["sentence", "pronoun", "antecedent", "most attended", "right"],
                                        [[p["sentence"], p["pronoun"], p["antecedent"], p["predicted"],
                                          "yes" if p["hit"] else "no"] for p in self.best_head_predictions]))
        return "\n".join(lines) + "\n"

    def figures(self, out_dir: Path) -> list[Path]:
        panels = {"argmax accuracy": self.accuracy, "attention to antecedent": self.mean_attention}
        if self.candidate_accuracy is not None:
            panels["candidate accuracy"] = self.candidate_accuracy
        mark = {name: (self.top[0].layer, self.top[0].head) for name in panels} if self.top else None
        return [plots.plot_layer_head_maps(panels, out_dir / "antecedent_heads.png",
                                           f"pronoun -> antecedent over {self.num_examples} example(s)", mark)]


def rank_antecedent_heads(maps: Sequence[AttentionMaps], examples: Sequence[Any], *, top_k: int = 10,
                          rank_by: str = "accuracy") -> AntecedentHeads:
    """Rank every head on precomputed attention maps (one per example, of its sentence)."""
    examples = [CoreferenceExample.coerce(e) for e in examples]
    if len(maps) != len(examples) or not examples:
        raise InputError(f"need one attention map per example and at least one example; got {len(maps)} maps "
                         f"for {len(examples)} examples")
    if rank_by not in RANKINGS:
        raise InputError(f"rank_by must be one of {RANKINGS}, found {rank_by!r}")
    if top_k <= 0:
        raise InputError(f"top_k must be positive, found {top_k}")
    scores = [score_example(m, e) for m, e in zip(maps, examples)]
    accuracy = np.mean([s.hit for s in scores], axis=0)
    mean_attention = np.mean([s.to_antecedent for s in scores], axis=0)
    chance_attention = float(np.mean([s.chance_attention for s in scores]))
    with_distractors = [s for s in scores if s.to_distractors is not None]
    candidate_accuracy = distractor_attention = None
    if with_distractors:
        candidate_accuracy = np.mean([s.to_antecedent > s.to_distractors.max(axis=-1) for s in with_distractors],
                                     axis=0)
        distractor_attention = np.mean([s.to_distractors.mean(axis=-1) for s in with_distractors], axis=0)
    elif rank_by == "candidate_accuracy":
        raise InputError("rank_by='candidate_accuracy' needs examples that list distractors")

    primary = {"accuracy": accuracy, "attention": mean_attention, "candidate_accuracy": candidate_accuracy}[rank_by]
    layers, heads = accuracy.shape
    # Best first; ties (frequent for accuracies over few examples) go to the head with more attention.
    order = np.lexsort((-mean_attention.ravel(), -primary.ravel()))[:top_k]
    top = [HeadScore(
        layer=int(i // heads), head=int(i % heads), accuracy=float(accuracy.flat[i]),
        mean_attention=float(mean_attention.flat[i]), attention_lift=float(mean_attention.flat[i] / chance_attention),
        candidate_accuracy=None if candidate_accuracy is None else float(candidate_accuracy.flat[i]),
        distractor_attention=None if distractor_attention is None else float(distractor_attention.flat[i]),
    ) for i in order]
    best = top[0]
    predictions = [{
        "sentence": e.sentence, "pronoun": _shown(e.sentence, e.pronoun, e.pronoun_occurrence),
        "antecedent": _shown(e.sentence, e.antecedent, e.antecedent_occurrence),
        "predicted": s.words[int(s.predicted_word[best.layer, best.head])],
        "hit": bool(s.hit[best.layer, best.head]),
        "attention_to_antecedent": float(s.to_antecedent[best.layer, best.head]),
    } for e, s in zip(examples, scores)]
    nearest = [s.nearest_is_antecedent for s in with_distractors]
    return AntecedentHeads(
        num_examples=len(examples), num_layers=layers, num_heads=heads, rank_by=rank_by, top=top,
        chance_attention=chance_attention, chance_accuracy=float(np.mean([s.chance_accuracy for s in scores])),
        examples_with_distractors=len(with_distractors),
        candidate_chance=float(np.mean([1 / (1 + s.to_distractors.shape[-1]) for s in with_distractors]))
        if with_distractors else None,
        nearest_candidate_accuracy=float(np.mean(nearest)) if nearest else None,
        accuracy=accuracy, mean_attention=mean_attention, candidate_accuracy=candidate_accuracy,
        best_head_predictions=predictions,
    )


def _shown(sentence: str, mention: Mention, occurrence: int) -> str:
    start, end = resolve_span(sentence, mention, occurrence)
    return sentence[start:end]


def find_antecedent_heads(analyzer: AttentionAnalyzer, examples: Iterable[Any], *, top_k: int = 10,
                          rank_by: str = "accuracy") -> AntecedentHeads:
    """Run the model on each example's sentence and rank its heads (see the module doc)."""
    examples = [CoreferenceExample.coerce(e) for e in examples]
    if not examples:
        raise InputError("no coreference examples given")
    maps = analyzer.attend_many([e.sentence for e in examples])
    return rank_antecedent_heads(maps, examples, top_k=top_k, rank_by=rank_by)
