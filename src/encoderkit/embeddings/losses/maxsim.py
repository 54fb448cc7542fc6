"""Multiple-negatives ranking loss of multi-vector (ColBERT) embeddings, scored by MaxSim: PyLate's ``Contrastive``
loss (lightonai/pylate, ``losses.Contrastive``), with the false-negative masking and process gathering of
``MultipleNegativesRankingLoss``.

For a batch of K (query, positive) pairs and N - 1 hard-negative columns, query i ranks the K x N candidates
(every positive, then every negative column) by

    S(q_i, c) = scale * sum_t max_u <q_i,t, c_u>,

the MaxSim of its token vectors with the candidate's, and the loss is the mean over the queries of the cross-entropy
of that softmax with the right positive on the diagonal:

    L = -(1/K) * sum_i log( exp(S(q_i, p_i)) / sum_c exp(S(q_i, c)) ).

scale = 1 by default: PyLate's ``temperature`` is 1 (scale = 1 / temperature), MaxSim sums ``query_length`` cosines
and so already spans [-32, 32]. The order of the candidates changes nothing (PyLate orders them query-major).

Masks. The inputs are what ``MultiVectorModel.forward`` returns: (vectors, mask) of each column, the mask marking the
tokens that count (a query's expansion tokens do, a document's padding and skiplist tokens do not). A document token
that does not count is left out of the max; PyLate multiplies its score by 0 instead, which makes no difference
wherever every query token's best real match is not negative (a random model may have some that are; a trained one
rarely).

``duplicates`` and ``gather_across_processes``: as in ``MultipleNegativesRankingLoss`` (its docstring has the
arguments). Gathering pads each column to the longest document of any process first.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...distributed import world_and_rank
from ...errors import InputError
from ..multi_vector import maxsim_scores
from ._distributed import StepWork, gather
from .mnrl import MultipleNegativesRankingLoss

TokenVectors = tuple[torch.Tensor, torch.Tensor]  # (batch, length, dim) vectors, (batch, length) mask


def check_token_vectors(loss: str, names: Sequence[str], columns: Sequence[Any]) -> int:
    """Each column is (vectors (batch, length, dim) float, mask (batch, length)), with one batch size and one
    dimension throughout; returns the batch size."""
    batch = dim = None
    for name, column in zip(names, columns):
        if not isinstance(column, (tuple, list)) or len(column) != 2 or \
                not all(isinstance(part, torch.Tensor) for part in column):
            raise InputError(f"{loss}: {name} must be the (vectors, mask) pair MultiVectorModel returns, found "
                             f"{type(column).__name__}")
        vectors, mask = column
        if vectors.dim() != 3 or not vectors.is_floating_point() or tuple(mask.shape) != tuple(vectors.shape[:2]):
            raise InputError(f"{loss}: {name} must be float vectors (batch, length, dim) and a mask (batch, length), "
                             f"found {tuple(vectors.shape)} and {tuple(mask.shape)}")
        if batch is None:
            batch, dim = vectors.shape[0], vectors.shape[2]
        elif vectors.shape[0] != batch or vectors.shape[2] != dim:
            raise InputError(f"{loss}: {name} holds {vectors.shape[0]} texts of dimension {vectors.shape[2]}, but "
                             f"{names[0]} {batch} of dimension {dim}; every column needs one row per example")
    if not batch:
        raise InputError(f"{loss}: the batch is empty")
    return batch


def _padded_to(vectors: torch.Tensor, mask: torch.Tensor, length: int) -> TokenVectors:
    extra = length - vectors.shape[1]
    if extra == 0:
        return vectors, mask.bool()
    return F.pad(vectors, (0, 0, 0, extra)), F.pad(mask.bool(), (0, extra))


class MaxSimMultipleNegativesRankingLoss(StepWork, nn.Module):
    """``forward(anchors, positives, *negatives, duplicates=None)``, each a ``MultiVectorModel`` output (vectors,
    mask): cross-entropy of scale x MaxSim over the batch's candidates, the right one on the diagonal."""

    def __init__(self, scale: float = 1.0, gather_across_processes: bool = False) -> None:
        super().__init__()
        if not scale > 0:
            raise InputError(f"the scale must be positive (1 / PyLate's temperature), found {scale}")
        self.scale = scale
        self.gather_across_processes = gather_across_processes

    def forward(self, anchors: TokenVectors, positives: TokenVectors, *negatives: TokenVectors,
                duplicates: torch.Tensor | None = None) -> torch.Tensor:
        columns = (anchors, positives, *negatives)
        names = ("anchors", "positives") + tuple(f"negatives[{k}]" for k in range(len(negatives)))
        batch = check_token_vectors("MaxSimMultipleNegativesRankingLoss", names, columns)
        queries, query_mask = anchors
        device = queries.device
        world, rank = world_and_rank() if self.gather_across_processes else (1, 0)
        # the labels and false-negative masks, checked and gathered as MultipleNegativesRankingLoss does
        rows, forward_mask, _ = self.once(
            ("masks", id(duplicates), len(columns), batch),
            lambda: MultipleNegativesRankingLoss._rows_and_masks(self, duplicates, len(columns), batch, device,
                                                                 world, rank))
        length = max(column[0].shape[1] for column in columns[1:])
        if world > 1:
            longest = torch.tensor([length], device=device)
            dist.all_reduce(longest, op=dist.ReduceOp.MAX)
            length = int(longest.item())
        candidates = [_padded_to(vectors, mask, length) for vectors, mask in columns[1:]]
        if world > 1:
            candidates = [(gather(vectors), gather(mask)) for vectors, mask in candidates]
        documents = torch.cat([vectors for vectors, _ in candidates])
        document_mask = torch.cat([mask for _, mask in candidates])
        scores = self.scale * maxsim_scores(queries, documents, query_mask, document_mask)
        if forward_mask is not None:
            scores = scores.masked_fill(forward_mask, float("-inf"))
        return F.cross_entropy(scores, rows)
