"""Multiple-negatives ranking loss: in-batch negatives, optional hard negatives, optional symmetric term,
and no false negatives when a text repeats in the batch.

Henderson et al. (2017), "Efficient Natural Language Response Suggestion for Smart Reply", arXiv:1705.00652,
section 4.4: for a batch of K (anchor, positive) pairs, every other positive is a negative of an anchor, and
the loss is the negative log-likelihood of the right positive under a softmax over the batch's candidates:

    L = -(1/K) * sum_i log( exp(S(a_i, c_i)) / sum_j exp(S(a_i, c_j)) ),    S(x, y) = scale * cos(x, y),

where the candidates c are the K positives followed by any hard-negative columns (K more per column), and
scale = 20 (a temperature of 0.05). ``symmetric=True`` adds the reverse direction, each positive ranking the
K anchors, and averages the two: L = (L_anchor->candidate + L_positive->anchor) / 2 (hard negatives take no
part in the reverse term).

False negatives. When a text occurs twice in a batch (two questions about one paragraph, one question with
two answers), the copy is a right answer, not a negative, and ranking it below the positive teaches the model
to push a text away from itself. ``forward(..., duplicates=ids)`` takes one integer id per text (equal ids:
the same text; see ``text_ids``) and leaves out of each softmax every candidate that is a right answer other
than the diagonal one: for anchor i, every candidate whose text is the positive of any anchor with the same
text as a_i; for positive i in the reverse term, every anchor whose text is the anchor of any pair with the
same positive as p_i. sentence-transformers 6 masks nothing in the loss (its ``gather_across_devices`` only
gathers embeddings from other GPUs); it relies on a ``NoDuplicatesBatchSampler`` that keeps repeated texts
out of a batch.

Several processes. With ``gather_across_processes=True`` the candidates (and, symmetric, the anchors) of every
process of a ``torch.distributed`` run are gathered with gradients: process p ranks its own anchors against all
of them, its labels offset by p x batch. The mean of the processes' losses is then the loss of the global batch,
and DDP's average of their gradients its gradient (``_distributed`` has the argument).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...distributed import world_and_rank
from ...errors import InputError
from ._checks import check_embeddings
from ._distributed import StepWork, check_batch_sizes, gather


def text_ids(columns: Sequence[Sequence[str]]) -> torch.Tensor:
    """(columns, batch) integer ids of a batch's texts, equal for equal texts: the ``duplicates`` argument of
    ``MultipleNegativesRankingLoss`` from the texts a data loader holds (anchors, positives, negatives...)."""
    ids: dict[str, int] = {}
    return torch.tensor([[ids.setdefault(text, len(ids)) for text in column] for column in columns],
                        dtype=torch.long)


def false_negative_masks(duplicates: torch.Tensor,
                         rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """From (columns, batch) text ids: a (batch, candidates) mask of the candidates that are right answers of
    each anchor besides its own positive, and a (batch, batch) mask of the anchors that are right answers of
    each positive besides its own anchor (the reverse term). ``rows``: only these anchors' (positives') rows
    (one process's part of a gathered batch).

    Anchor i's right answers are the texts p_j of the pairs (a_j, p_j) with a_j = a_i, so candidate c is masked
    when (a_i, c) is one of the batch's (anchor, positive) pairs; positive i's right answers are the anchors a_k
    with (p_i, a_k) among the (positive, anchor) pairs. Testing membership of those pairs (as one integer key
    each) costs a sort, not a (batch x batch x candidates) product, so a batch gathered from many processes stays
    cheap."""
    _, compact = torch.unique(duplicates, return_inverse=True)  # ids 0..n-1, so that a pair fits one int64
    n = int(compact.max()) + 1
    anchors, positives, candidates = compact[0], compact[1], compact[1:].reshape(-1)
    rows = torch.arange(len(anchors), device=duplicates.device) if rows is None else rows
    forward = torch.isin(anchors[rows, None] * n + candidates[None, :], anchors * n + positives)
    backward = torch.isin(positives[rows, None] * n + anchors[None, :], positives * n + anchors)
    local = torch.arange(len(rows), device=duplicates.device)
    forward[local, rows] = False
    backward[local, rows] = False
    return forward, backward


class MultipleNegativesRankingLoss(StepWork, nn.Module):
    """``forward(anchors, positives, *negatives, duplicates=None)``: cross-entropy of scale * cos over the batch's
    candidates, the right one on the diagonal. ``duplicates``: optional (columns, batch) integer text ids (one
    row per tensor passed, in order; ``text_ids`` builds them) so that repeated texts are not negatives.

    ``gather_across_processes=True``: in a ``torch.distributed`` run (torchrun, DDP) each process ranks its own
    anchors against the candidates of every process (and, symmetric, its own positives against every anchor),
    gathered with gradients, so the negatives grow with the number of processes; the labels are offset by the
    rank times the local batch. Averaged by DDP, the gradients equal those of one process on the concatenated
    batch (see ``_distributed``). Every process must hold a batch of one size, and ``duplicates`` ids must mean
    the same text on every process (``train_embedder`` numbers the texts of the whole global batch). Outside a
    distributed run it changes nothing."""

    def __init__(self, scale: float = 20.0, symmetric: bool = False, gather_across_processes: bool = False,
                 similarity: str = "cosine") -> None:
        """``similarity``: "cosine" (sentence embedders) or "dot" (SPLADE's sparse vectors, with scale 1, as
        sentence-transformers' SparseMultipleNegativesRankingLoss)."""
        super().__init__()
        if not scale > 0:
            raise InputError(f"the scale must be positive, found {scale}")
        if similarity not in ("cosine", "dot"):
            raise InputError(f"similarity must be 'cosine' or 'dot', found {similarity!r}")
        self.similarity = similarity
        self.scale = scale
        self.symmetric = symmetric
        self.gather_across_processes = gather_across_processes

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor, *negatives: torch.Tensor,
                duplicates: torch.Tensor | None = None) -> torch.Tensor:
        columns = (anchors, positives, *negatives)
        names = ("anchors", "positives") + tuple(f"negatives[{k}]" for k in range(len(negatives)))
        batch = check_embeddings("MultipleNegativesRankingLoss", names, *columns)
        world, rank = world_and_rank() if self.gather_across_processes else (1, 0)
        rows, forward_mask, backward_mask = self.once(  # one per step under MatryoshkaLoss (StepWork)
            ("masks", id(duplicates), len(columns), batch),
            lambda: self._rows_and_masks(duplicates, len(columns), batch, anchors.device, world, rank))
        candidates = columns[1:]
        if world > 1:
            candidates = tuple(gather(column) for column in candidates)
        a, c = anchors, torch.cat(candidates, dim=0)
        if self.compares_by_cosine:
            a, c = F.normalize(a, p=2, dim=1), F.normalize(c, p=2, dim=1)
        scores = self.scale * a @ c.T  # (batch, global batch * (1 + negative columns))
        if forward_mask is not None:
            scores = scores.masked_fill(forward_mask, float("-inf"))
        loss = F.cross_entropy(scores, rows)
        if self.symmetric:
            # positive i (its normalised row of c: the local rows of the positives) against every anchor
            all_anchors = gather(a) if world > 1 else a
            reverse = self.scale * c[rank * batch:(rank + 1) * batch] @ all_anchors.T
            if backward_mask is not None:
                reverse = reverse.masked_fill(backward_mask, float("-inf"))
            loss = (loss + F.cross_entropy(reverse, rows)) / 2
        return loss

    @property
    def compares_by_cosine(self) -> bool:
        return self.similarity == "cosine"

    def _rows_and_masks(self, duplicates: Any, columns: int, batch: int, device: torch.device, world: int,
                        rank: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """What a step's loss needs besides the embeddings, the same for every Matryoshka dimension: the local
        rows' labels and the false-negative masks (None without ``duplicates``), after checking the text ids and,
        gathering, that every process holds a batch of one size."""
        if duplicates is not None:
            duplicates = torch.as_tensor(duplicates, device=device)
            if duplicates.shape != (columns, batch) or duplicates.is_floating_point():
                raise InputError(f"duplicates must be integer text ids of shape (columns, batch) = "
                                 f"({columns}, {batch}), found {duplicates.dtype} {tuple(duplicates.shape)}")
        if world > 1:
            check_batch_sizes("MultipleNegativesRankingLoss", batch, device)
            if duplicates is not None:
                duplicates = gather(duplicates.T.contiguous()).T
        rows = torch.arange(rank * batch, (rank + 1) * batch, device=device)  # the local rows' labels
        if duplicates is None:
            return rows, None, None
        return (rows, *false_negative_masks(duplicates, rows))
