"""Matryoshka representation learning: one loss applied to nested prefixes of the embeddings.

Kusupati et al. (2022), "Matryoshka Representation Learning", NeurIPS, eq. 1: for a set M of nested
dimensions (e.g. 384, 256, 128, 64) with weights c_m, the inner loss L is applied to the first m coordinates
of every embedding,

    L_MRL = sum_{m in M} c_m * L(z_{1:m}),

so that a truncated embedding (``--truncate-dim m``) stays a good embedding. Where the inner loss compares by
cosine the prefixes are re-normalised (this changes no cosine, and it is what searching with truncated,
normalised vectors compares). sentence-transformers' ``MatryoshkaLoss`` re-normalises for every inner loss;
pass ``normalize=True`` to do the same for a Euclidean triplet loss.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import InputError
from .cached_mnrl import CachedMultipleNegativesRankingLoss
from .softmax import SoftmaxLoss


class MatryoshkaLoss(nn.Module):
    """``forward(*embeddings, **targets)``: sum over ``dims`` of weight * inner loss on the embeddings cut to the
    first dim coordinates. Positional 2-D tensors are embeddings and are cut; anything else (scores, labels,
    ``duplicates=``) is passed on as is."""

    def __init__(self, loss: nn.Module, dims: Sequence[int], weights: Sequence[float] | None = None,
                 normalize: bool | None = None) -> None:
        super().__init__()
        if isinstance(loss, SoftmaxLoss):
            raise InputError("MatryoshkaLoss cannot wrap SoftmaxLoss: its classifier reads all 3 x dimension "
                             "features, so a truncated embedding has no classifier")
        if isinstance(loss, CachedMultipleNegativesRankingLoss):
            raise InputError("MatryoshkaLoss wraps losses of embeddings; for the cached loss write "
                             "CachedMultipleNegativesRankingLoss(model, loss=MatryoshkaLoss("
                             "MultipleNegativesRankingLoss(), dims))")
        dims = [int(d) for d in dims]
        if not dims or any(d <= 0 for d in dims) or len(set(dims)) != len(dims):
            raise InputError(f"Matryoshka dims must be distinct positive integers, found {list(dims)}")
        weights = [1.0] * len(dims) if weights is None else [float(w) for w in weights]
        if len(weights) != len(dims):
            raise InputError(f"{len(dims)} Matryoshka dims but {len(weights)} weights")
        pairs = sorted(zip(dims, weights), reverse=True)
        self.dims = tuple(d for d, _ in pairs)
        self.weights = tuple(w for _, w in pairs)
        self.loss = loss
        self.normalize = bool(getattr(loss, "compares_by_cosine", False)) if normalize is None else normalize

    @property
    def compares_by_cosine(self) -> bool:
        return bool(getattr(self.loss, "compares_by_cosine", False))

    def truncate(self, embeddings: torch.Tensor, dim: int) -> torch.Tensor:
        if dim > embeddings.shape[-1]:
            raise InputError(f"Matryoshka dim {dim} is larger than the embeddings' dimension {embeddings.shape[-1]}")
        prefix = embeddings[..., :dim]
        return F.normalize(prefix, p=2, dim=-1) if self.normalize else prefix

    def forward(self, *embeddings: Any, **targets: Any) -> torch.Tensor:
        total = None
        # Every dimension's call sees one batch: the inner loss's step work (MNRL's masks, the gathered text ids,
        # the batch-size check) is done once (losses/_distributed.StepWork).
        scope = getattr(self.loss, "step_scope", None)
        with scope() if scope is not None else nullcontext():
            cut = list(embeddings)
            for dim, weight in zip(self.dims, self.weights):
                # Each prefix is cut from the previous (normalised) one, largest first: the same vectors as cutting
                # the full embedding, and the rounding of sentence-transformers' MatryoshkaLoss, which shrinks its
                # cached embeddings in place dimension after dimension (a cosine loss's scale of 20 carries a
                # one-ulp difference into the gradients).
                cut = [self.truncate(e, dim) if isinstance(e, torch.Tensor) and e.dim() == 2 else e for e in cut]
                term = weight * self.loss(*cut, **targets)
                total = term if total is None else total + term
        return total
