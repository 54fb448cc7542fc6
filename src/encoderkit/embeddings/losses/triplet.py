"""Triplet loss: the anchor nearer to its positive than to its negative, by a margin.

Schroff, Kalenichenko & Philbin (2015), "FaceNet: A Unified Embedding for Face Recognition and Clustering",
CVPR, eq. 2-3; used for sentences by Reimers & Gurevych (2019), "Sentence-BERT", section 3, "Triplet
Objective Function":

    L = (1/N) * sum_i max(d(a_i, p_i) - d(a_i, n_i) + margin, 0)

with d the Euclidean distance ||x - y||_2 or the cosine distance 1 - cos(x, y). The default margin, 5, and
the default distance, Euclidean, are sentence-transformers' ``TripletLoss`` defaults (it keeps 5 for every
distance). The SBERT paper itself used margin 1. A cosine distance lies in [0, 2], so with margin >= 2 the
hinge never closes and the loss is the plain difference of distances plus the margin; choose a margin below 2
(e.g. 0.5) for a cosine triplet loss that stops pushing satisfied triplets.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import InputError
from ._checks import check_embeddings

DISTANCES = ("euclidean", "cosine")


class TripletLoss(nn.Module):
    """``forward(anchors, positives, negatives)``: mean of relu(d(a, p) - d(a, n) + margin)."""

    def __init__(self, distance: str = "euclidean", margin: float = 5.0) -> None:
        super().__init__()
        if distance not in DISTANCES:
            raise InputError(f"unknown triplet distance {distance!r}; choose one of {', '.join(DISTANCES)}")
        if margin < 0:
            raise InputError(f"the triplet margin must be non-negative, found {margin}")
        self.distance = distance
        self.margin = margin

    @property
    def compares_by_cosine(self) -> bool:
        return self.distance == "cosine"

    def distances(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.distance == "cosine":
            return 1.0 - F.cosine_similarity(x, y, dim=1)
        return torch.linalg.vector_norm(x - y, dim=1)

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        check_embeddings("TripletLoss", ("anchors", "positives", "negatives"), anchors, positives, negatives)
        gap = self.distances(anchors, positives) - self.distances(anchors, negatives)
        return F.relu(gap + self.margin).mean()
