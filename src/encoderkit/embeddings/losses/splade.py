"""SPLADE's training loss: a ranking loss on sparse vectors plus FLOPS regularisation, which pushes the vectors to
be sparse (Formal et al., 2021, "SPLADE", arXiv:2107.05720, section 3; Paria et al., 2020, arXiv:2004.05665).

    L = MNRL_dot(q, d+, d-...) + w_q * FLOPS(q) + w_d * FLOPS([d+; d-...]),    FLOPS(V) = sum_t (mean_i V[i, t])^2

MNRL_dot is ``MultipleNegativesRankingLoss`` with dot products and scale 1 (the vectors are not normalised: their
magnitude is the term weights). FLOPS approximates the expected number of multiplications of a sparse dot product:
the square of each term's mean activation, summed over the vocabulary, so a term active in many texts costs more
than a rare one. ``threshold`` (sentence-transformers' ``*_regularizer_threshold``) regularises only the vectors
with more than that many non-zero terms. This equals sentence-transformers' ``SpladeLoss`` around
``SparseMultipleNegativesRankingLoss`` (tests/embeddings/test_sparse.py). In a distributed run the ranking term gathers the
candidates of every process (as ``MultipleNegativesRankingLoss`` does) and FLOPS is each process's own batch, as in
sentence-transformers.
"""
from __future__ import annotations

import torch
from torch import nn

from ...errors import InputError
from .mnrl import MultipleNegativesRankingLoss


def flops(vectors: torch.Tensor, threshold: float | None = None) -> torch.Tensor:
    """sum_t (mean_i vectors[i, t])^2; with ``threshold``, rows of at most that many non-zero terms count as 0."""
    if threshold is not None:
        vectors = vectors * ((vectors != 0).sum(dim=1) > threshold).to(vectors.dtype)[:, None]
    return (vectors.mean(dim=0) ** 2).sum()


class SpladeLoss(nn.Module):
    """``forward(queries, positives, *negatives, duplicates=None)``: the dot-product ranking loss plus the
    weighted FLOPS of the queries and of the documents (positives and negatives together)."""

    compares_by_cosine = False

    def __init__(self, query_regularizer_weight: float = 5e-5, document_regularizer_weight: float = 3e-5, *,
                 scale: float = 1.0, query_threshold: float | None = None, document_threshold: float | None = None,
                 gather_across_processes: bool = False) -> None:
        super().__init__()
        for name, value in (("query_regularizer_weight", query_regularizer_weight),
                            ("document_regularizer_weight", document_regularizer_weight)):
            if not value >= 0:
                raise InputError(f"{name} must be zero or positive, found {value}")
        self.query_weight, self.document_weight = query_regularizer_weight, document_regularizer_weight
        self.query_threshold, self.document_threshold = query_threshold, document_threshold
        self.ranking = MultipleNegativesRankingLoss(scale=scale, similarity="dot",
                                                    gather_across_processes=gather_across_processes)

    def parts(self, queries: torch.Tensor, positives: torch.Tensor, *negatives: torch.Tensor,
              duplicates: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The three terms, weighted: {"ranking", "query_flops", "document_flops"} (they sum to the loss)."""
        ranking = self.ranking(queries, positives, *negatives, duplicates=duplicates)
        documents = torch.cat((positives, *negatives))
        return {"ranking": ranking, "query_flops": self.query_weight * flops(queries, self.query_threshold),
                "document_flops": self.document_weight * flops(documents, self.document_threshold)}

    def forward(self, queries: torch.Tensor, positives: torch.Tensor, *negatives: torch.Tensor,
                duplicates: torch.Tensor | None = None) -> torch.Tensor:
        return sum(self.parts(queries, positives, *negatives, duplicates=duplicates).values())
