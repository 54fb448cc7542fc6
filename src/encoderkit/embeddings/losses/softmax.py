"""Softmax (classification) loss over a sentence pair: SBERT's objective for NLI.

Reimers & Gurevych (2019), "Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks", EMNLP,
section 3, "Classification Objective Function":

    o = softmax(W_t [u; v; |u - v|]),    W_t in R^(k x 3n),

trained with cross-entropy against the gold label, where u and v are the two sentences' embeddings of
dimension n and k the number of labels. The classifier (``self.classifier``, a Linear(3n, k) with a bias)
belongs to the loss, not to the embedder, and is saved beside the model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import InputError
from ._checks import check_embeddings, check_targets


class SoftmaxLoss(nn.Module):
    """Cross-entropy of a linear classifier over (u, v, |u - v|). ``forward(u, v, labels)``: labels are class
    indices in [0, num_labels)."""

    compares_by_cosine = False

    def __init__(self, dimension: int, num_labels: int) -> None:
        super().__init__()
        if dimension <= 0 or num_labels < 2:
            raise InputError(f"SoftmaxLoss needs a positive dimension and at least 2 labels, "
                             f"found dimension={dimension}, num_labels={num_labels}")
        self.dimension = dimension
        self.num_labels = num_labels
        self.classifier = nn.Linear(3 * dimension, num_labels)

    def logits(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(batch, num_labels) scores W_t [u; v; |u - v|] + b."""
        check_embeddings("SoftmaxLoss", ("u", "v"), u, v)
        if u.shape[1] != self.dimension:
            raise InputError(f"SoftmaxLoss was built for {self.dimension}-dimensional embeddings, "
                             f"found {u.shape[1]}")
        features = torch.cat([u, v, (u - v).abs()], dim=1)
        return self.classifier(features.to(self.classifier.weight.dtype))

    def forward(self, u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.logits(u, v)
        labels = torch.as_tensor(labels, device=logits.device)
        if labels.is_floating_point():
            raise InputError(f"SoftmaxLoss: labels must be class indices (integers), found {labels.dtype}")
        labels = check_targets("SoftmaxLoss", "labels", labels, len(u), low=0, high=self.num_labels - 1)
        return F.cross_entropy(logits, labels.long())
