"""CoSENT: a ranking loss over the cosine similarities of scored pairs.

Su Jianlin (2022), "CoSENT (1): a more efficient sentence vector scheme than Sentence-BERT",
https://kexue.fm/archives/8847. For every two pairs (i, j) of the batch whose gold scores say that pair i
is more similar than pair j (s_i > s_j), the model's cosine of pair i should exceed that of pair j:

    L = log(1 + sum_{(i, j): s_i > s_j} exp(lambda * (cos(u_j, v_j) - cos(u_i, v_i)))),    lambda = 20.

Only the order of the scores matters (ties give no term), so any score scale works.

The sum runs over every two pairs of the batch, so in a distributed run each process's own batch would give
another loss. ``gather_across_processes=True`` gathers the cosines (with gradients) and the scores of every
process, and each process computes the loss of the whole global batch; averaged by DDP, the gradients are those
of one process on the concatenated batch (see ``_distributed``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...distributed import world_and_rank
from ._checks import check_embeddings, check_targets
from ._distributed import StepWork, check_batch_sizes, gather


class CoSENTLoss(StepWork, nn.Module):
    """``forward(u, v, scores)``: log(1 + sum over s_i > s_j of exp(scale * (cos_j - cos_i)))."""

    compares_by_cosine = True

    def __init__(self, scale: float = 20.0, gather_across_processes: bool = False) -> None:
        super().__init__()
        self.scale = scale
        self.gather_across_processes = gather_across_processes

    def forward(self, u: torch.Tensor, v: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        batch = check_embeddings("CoSENTLoss", ("u", "v"), u, v)
        scores = check_targets("CoSENTLoss", "scores", scores, batch).to(u.device)
        # the cosine as the dot product of unit vectors, as sentence-transformers computes it (the same value; the
        # same rounding, which the scale of 20 would otherwise carry into the gradients)
        cosine = (F.normalize(u.float(), dim=1) * F.normalize(v.float(), dim=1)).sum(dim=1) * self.scale
        if self.gather_across_processes and world_and_rank()[0] > 1:
            self.once(("sizes", batch), lambda: check_batch_sizes("CoSENTLoss", batch, u.device))
            cosine, scores = gather(cosine), gather(scores.contiguous())
        return ordered_pairs_logsumexp(cosine, scores)


def ordered_pairs_logsumexp(cosine: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """log(1 + sum over s_i > s_j of exp(cos_j - cos_i)) without the n x n matrix: with the pairs sorted by score,
    each pair j adds cos_j plus the log-sum of exp(-cos_i) over the pairs of strictly higher score, a suffix of the
    sorted order (ties excluded by searching for the end of each score's run). O(n log n) time, O(n) memory."""
    scores, order = scores.sort()
    cosine = cosine[order]
    first_higher = torch.searchsorted(scores, scores, right=True)
    suffix = torch.logcumsumexp(-cosine.flip(0), dim=0).flip(0)
    suffix = torch.cat([suffix, cosine.new_full((1,), float("-inf"))])  # the highest scores: nothing above
    terms = cosine + suffix[first_higher]
    return torch.logsumexp(torch.cat([terms.new_zeros(1), terms]), dim=0)  # the 1 inside the log: exp(0)
