"""Cosine-similarity regression: SBERT's objective for scored pairs (STS).

Reimers & Gurevych (2019), "Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks", EMNLP,
section 3, "Regression Objective Function": the cosine similarity of the two embeddings is regressed on
the gold score with a mean squared error,

    L = (1/N) * sum_i (cos(u_i, v_i) - y_i)^2,    y_i in [0, 1]

(STS-B's 0-5 scores divided by 5). A score outside [0, 1] is refused with an ``InputError`` naming it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_embeddings, check_targets


class CosineSimilarityLoss(nn.Module):
    """Mean squared error between cos(u, v) and the gold score. ``forward(u, v, scores)``."""

    compares_by_cosine = True

    def forward(self, u: torch.Tensor, v: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        batch = check_embeddings("CosineSimilarityLoss", ("u", "v"), u, v)
        scores = check_targets("CosineSimilarityLoss", "scores", scores, batch, low=0.0, high=1.0)
        cosine = F.cosine_similarity(u, v, dim=1)
        return F.mse_loss(cosine, scores.to(device=cosine.device, dtype=cosine.dtype))
