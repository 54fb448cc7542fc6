"""Hard-negative mining: for each (anchor, positive) pair, the corpus texts nearest the anchor that are not
its positives and score clearly below them.

Semantics (those of sentence-transformers' ``util.mine_hard_negatives`` with ``absolute_margin``):

- texts are embedded normalised, so scores are cosine similarities; the search is exact (chunked);
- the corpus is ``corpus`` plus every positive, without duplicates;
- an anchor that appears in several pairs has all their positives excluded, and its positive score is the
  lowest of them; the anchor's own text is never a negative either;
- candidates are the non-positives ranked ``range_min + 1 .. range_max`` by score (rank 1 = nearest);
- the margin is absolute: a candidate is kept only if ``score + margin <= positive_score``; a candidate
  within ``margin`` of the positive (a near-duplicate of it, or an unlabelled right answer) is dropped.
  ``margin=None`` keeps every candidate; ``0`` keeps those scoring at most the positive;
- the ``num_negatives`` best kept candidates become ``negative_1..n``; a pair with fewer is left out
  (counted in ``MinedNegatives.left_out``), as sentence-transformers' "n-tuple" output does.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import InputError
from ..tasks.search import build_index
from .data import AnchorPositive

log = logging.getLogger(__name__)


@dataclass
class MinedNegatives:
    examples: list[AnchorPositive]  # one per kept (anchor, positive) pair, in input order
    left_out: int  # pairs with fewer than num_negatives negatives
    within_margin: int  # candidates dropped by the margin
    positive_mean: float  # mean score(anchor, positive) over the kept pairs
    negative_mean: float  # mean score(anchor, negative) over the kept negatives

    def summary(self, num_negatives: int) -> str:
        line = (f"mined {num_negatives} negative(s) for {len(self.examples):,} of "
                f"{len(self.examples) + self.left_out:,} pairs")
        if self.examples:
            line += f" (mean score: positive {self.positive_mean:.3f}, negatives {self.negative_mean:.3f})"
        if self.left_out:
            line += (f"; {self.left_out:,} left out with fewer candidates outside the margin "
                     "(raise --range-max or lower --margin)")
        return line


def _embed(embedder: Any, texts: list[str], batch_size: int, description: str, show_progress: bool,
           prompt: str | None = None, prompt_name: str | None = None) -> np.ndarray:
    from ..progress import Progress

    from ..tasks.embed import prompt_options

    with Progress(len(texts), description, "texts", enabled=show_progress) as progress:
        vectors = embedder.encode(texts, batch_size=batch_size, normalize=True, progress=progress.advance,
                                  **prompt_options(prompt, prompt_name))
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def _check_mining(anchors: list[str], positives: list[str], num_negatives: int, range_min: int,
                  range_max: int | None, margin: float | None) -> int:
    """The mining settings checked; returns ``range_max`` (default: ``range_min + 10 * num_negatives``)."""
    if len(anchors) != len(positives):
        raise InputError(f"got {len(anchors)} anchors but {len(positives)} positives")
    if not anchors:
        raise InputError("no (anchor, positive) pairs to mine negatives for")
    if num_negatives < 1:
        raise InputError(f"num_negatives must be at least 1, found {num_negatives}")
    if range_min < 0:
        raise InputError(f"range_min must be non-negative, found {range_min}")
    if range_max is None:
        range_max = range_min + 10 * num_negatives
    if range_max - range_min < num_negatives:
        raise InputError(f"range_max - range_min ({range_max} - {range_min}) leaves fewer than num_negatives "
                         f"({num_negatives}) candidates; raise range_max")
    if margin is not None and not np.isfinite(margin):
        raise InputError(f"margin must be a finite number, found {margin}")
    return range_max


def mine_hard_negatives(embedder: Any, anchors: Sequence[str], positives: Sequence[str],
                        corpus: Sequence[str] | None = None, *, k: int | None = None, margin: float | None = 0.05,
                        range_min: int = 0, range_max: int | None = None, num_negatives: int = 3,
                        batch_size: int = 64, query_chunk: int = 1024, show_progress: bool = False,
                        query_prompt: str | None = None, query_prompt_name: str | None = None,
                        document_prompt: str | None = None, document_prompt_name: str | None = None
                        ) -> MinedNegatives:
    """Mine ``num_negatives`` hard negatives per (anchor, positive) pair (see the module's docstring).

    ``embedder``: an ``encoderkit.Embedder`` (or anything with ``encode(texts, batch_size=, normalize=,
    progress=)`` returning one vector per text). ``range_max`` defaults to ``range_min + 10 * num_negatives``.
    ``k``: neighbours retrieved per anchor from the index; by default ``range_max`` plus the most positives
    (and the anchor itself) any anchor has, so that ``range_max`` non-positive candidates remain. The search
    scans ``query_chunk`` anchors at a time against the index's chunks, so memory stays bounded.
    ``query_prompt`` / ``query_prompt_name`` (the anchors) and ``document_prompt`` / ``document_prompt_name`` (the
    positives and the corpus): each side's prompt, as the text or the model's name for it (neither: the model's
    default), as a retrieval model embeds them.
    """
    anchors, positives = list(anchors), list(positives)
    range_max = _check_mining(anchors, positives, num_negatives, range_min, range_max, margin)

    texts = list(dict.fromkeys([*(corpus or []), *positives]))
    text_index = {text: i for i, text in enumerate(texts)}
    unique_anchors = list(dict.fromkeys(anchors))
    anchor_index = {text: i for i, text in enumerate(unique_anchors)}
    excluded: list[set[int]] = [set() for _ in unique_anchors]  # positives and the anchor itself, per anchor
    for anchor, positive in zip(anchors, positives):
        excluded[anchor_index[anchor]].add(text_index[positive])
    for anchor, row in anchor_index.items():
        if anchor in text_index:
            excluded[row].add(text_index[anchor])
    if k is None:
        k = range_max + max(len(e) for e in excluded)
    if k <= 0:
        raise InputError(f"k must be positive, found {k}")

    corpus_vectors = _embed(embedder, texts, batch_size, "embedding corpus", show_progress, document_prompt,
                            document_prompt_name)
    anchor_vectors = _embed(embedder, unique_anchors, batch_size, "embedding anchors", show_progress, query_prompt,
                            query_prompt_name)
    positive_rows = np.array([text_index[p] for p in positives])
    pair_anchor_rows = np.array([anchor_index[a] for a in anchors])
    pair_scores = np.einsum("ij,ij->i", anchor_vectors[pair_anchor_rows], corpus_vectors[positive_rows])
    # the lowest positive score of each anchor (the harder positive) sets its margin, as in sentence-transformers
    anchor_positive_score = np.full(len(unique_anchors), np.inf, dtype=np.float32)
    np.minimum.at(anchor_positive_score, pair_anchor_rows, pair_scores.astype(np.float32))

    index = build_index(corpus_vectors, kind="exact", metric="ip", chunk_rows=16384)
    from ..progress import Progress

    negatives: list[list[int]] = []
    within_margin = 0
    negative_scores: list[list[float]] = []
    with Progress(len(unique_anchors), "searching", "anchors", enabled=show_progress) as progress:
        for start in range(0, len(unique_anchors), query_chunk):
            found = index.search(anchor_vectors[start:start + query_chunk], k=k)
            for offset, (scores, rows) in enumerate(zip(found.scores, found.indices)):
                row = start + offset
                candidates = [(float(s), int(i)) for s, i in zip(scores, rows) if i >= 0 and int(i) not in excluded[row]]
                candidates = candidates[range_min:range_max]
                if margin is not None:
                    kept = [(s, i) for s, i in candidates if not s + margin > anchor_positive_score[row]]
                    within_margin += len(candidates) - len(kept)
                    candidates = kept
                negatives.append([i for _, i in candidates[:num_negatives]])
                negative_scores.append([s for s, _ in candidates[:num_negatives]])
            progress.advance(len(found.indices))

    examples, left_out, kept_positive, kept_negative = _pairs_with_negatives(
        anchors, positives, anchor_index, texts, negatives, negative_scores, pair_scores, num_negatives)
    if left_out:
        log.info("%d of %d pairs have fewer than %d negatives outside the margin", left_out, len(anchors),
                 num_negatives)
    return MinedNegatives(examples, left_out, within_margin,
                          float(np.mean(kept_positive)) if kept_positive else float("nan"),
                          float(np.mean(kept_negative)) if kept_negative else float("nan"))


def _pairs_with_negatives(anchors: list[str], positives: list[str], anchor_index: dict[str, int], texts: list[str],
                          negatives: list[list[int]], negative_scores: list[list[float]], pair_scores: np.ndarray,
                          num_negatives: int) -> tuple[list[AnchorPositive], int, list[float], list[float]]:
    """Each pair with its anchor's mined negatives, where it has ``num_negatives`` of them: (the examples, the pairs
    left out, the kept pairs' positive scores, their negatives' scores)."""
    examples, kept_positive, kept_negative = [], [], []
    left_out = 0
    for pair, (anchor, positive) in enumerate(zip(anchors, positives)):
        row = anchor_index[anchor]
        if len(negatives[row]) < num_negatives:
            left_out += 1
            continue
        examples.append(AnchorPositive(anchor, positive, tuple(texts[i] for i in negatives[row])))
        kept_positive.append(float(pair_scores[pair]))
        kept_negative.extend(negative_scores[row])
    return examples, left_out, kept_positive, kept_negative


__all__ = ["MinedNegatives", "mine_hard_negatives"]
