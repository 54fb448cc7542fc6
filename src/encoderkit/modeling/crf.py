"""A linear-chain conditional random field over word-level tag scores (Lafferty et al., 2001).

Scores of a tag sequence y for emissions e (words x tags): start[y_0] + sum_t e_t[y_t] +
sum_t transitions[y_{t-1}, y_t] + end[y_last]. Training minimises -log p(y | e) (the forward
algorithm gives the partition function); decoding is Viterbi; per-word tag probabilities come from
forward-backward. When the tags are IOB2 (O, B-X, I-X), transitions that cannot occur (I-X after O
or after another type, I-X first) are forbidden, so decoding never produces a broken entity.

Sequences are left-aligned: ``mask[b, :n_b]`` is True for the n_b words of sequence b.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

FORBIDDEN = -10000.0  # added to the score of an impossible transition (finite, so gradients stay finite)


def iob2_constraints(labels: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(allowed transitions (tags x tags), allowed first tags) for IOB2 labels; None for other tag sets."""
    kinds = []
    for label in labels:
        if label == "O":
            kinds.append(("O", ""))
        elif len(label) > 2 and label[1] == "-" and label[0] in "BI":
            kinds.append((label[0], label[2:]))
        else:
            return None
    count = len(labels)
    allowed = torch.ones(count, count, dtype=torch.bool)
    first = torch.ones(count, dtype=torch.bool)
    for to, (prefix, kind) in enumerate(kinds):
        if prefix != "I":
            continue
        first[to] = False
        for source, (previous_prefix, previous_kind) in enumerate(kinds):
            allowed[source, to] = previous_prefix in "BI" and previous_prefix != "O" and previous_kind == kind
    return allowed, first


class CRF(nn.Module):
    def __init__(self, num_tags: int, labels: Sequence[str] | None = None) -> None:
        super().__init__()
        self.num_tags = num_tags
        self.transitions = nn.Parameter(torch.zeros(num_tags, num_tags))
        self.start = nn.Parameter(torch.zeros(num_tags))
        self.end = nn.Parameter(torch.zeros(num_tags))
        constraints = iob2_constraints(labels) if labels is not None else None
        allowed, first = constraints if constraints is not None else (
            torch.ones(num_tags, num_tags, dtype=torch.bool), torch.ones(num_tags, dtype=torch.bool))
        self.register_buffer("transition_penalty", (~allowed).float() * FORBIDDEN, persistent=False)
        self.register_buffer("start_penalty", (~first).float() * FORBIDDEN, persistent=False)

    def _scores(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.transitions + self.transition_penalty, self.start + self.start_penalty, self.end)

    def log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log Z for each sequence: (batch,)."""
        return torch.logsumexp(self._forward_scores(emissions, mask)[-1] + self._scores()[2], dim=-1)

    def _forward_scores(self, emissions: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        transitions, start, _ = self._scores()
        alpha = start + emissions[:, 0]
        alphas = [alpha]
        for t in range(1, emissions.shape[1]):
            step = torch.logsumexp(alpha.unsqueeze(2) + transitions, dim=1) + emissions[:, t]
            alpha = torch.where(mask[:, t:t + 1], step, alpha)  # past a sequence's end, carry its last alpha
            alphas.append(alpha)
        return alphas

    def log_likelihood(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log p(tags | emissions) per sequence: (batch,). emissions (batch, words, tags), tags/mask (batch, words)."""
        transitions, start, end = self._scores()
        mask = mask.bool()
        tags = tags.masked_fill(~mask, 0)
        lengths = mask.sum(dim=1)
        rows = torch.arange(emissions.shape[0], device=emissions.device)
        score = start[tags[:, 0]] + emissions[rows, 0, tags[:, 0]]
        for t in range(1, emissions.shape[1]):
            step = transitions[tags[:, t - 1], tags[:, t]] + emissions[rows, t, tags[:, t]]
            score = score + step * mask[:, t]
        score = score + end[tags[rows, lengths - 1]]
        return score - self.log_partition(emissions, mask)

    def marginals(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """p(tag of word t = k | emissions) from forward-backward: (batch, words, tags); zero past the end."""
        transitions, _, end = self._scores()
        mask = mask.bool()
        alphas = self._forward_scores(emissions, mask)
        log_z = torch.logsumexp(alphas[-1] + end, dim=-1)
        words = emissions.shape[1]
        beta = end.expand(emissions.shape[0], -1).clone()
        betas = [beta]
        for t in range(words - 2, -1, -1):
            step = torch.logsumexp(transitions + (emissions[:, t + 1] + beta).unsqueeze(1), dim=2)
            # the last real word of a sequence gets the end scores; earlier words the recursion
            is_last = mask[:, t] & ~mask[:, t + 1]
            beta = torch.where(mask[:, t + 1:t + 2], step, torch.where(is_last.unsqueeze(1), end, beta))
            betas.append(beta)
        betas.reverse()
        log_marginals = torch.stack(alphas, dim=1) + torch.stack(betas, dim=1) - log_z[:, None, None]
        return log_marginals.exp() * mask.unsqueeze(-1)

    def decode(self, emissions: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        """The most probable tag sequence of each sequence (Viterbi)."""
        transitions, start, end = self._scores()
        mask = mask.bool()
        score = start + emissions[:, 0]
        backpointers = []
        for t in range(1, emissions.shape[1]):
            best, pointer = (score.unsqueeze(2) + transitions).max(dim=1)
            backpointers.append(pointer)
            score = torch.where(mask[:, t:t + 1], best + emissions[:, t], score)
        score = score + end
        paths = []
        for row, length in enumerate(mask.sum(dim=1).tolist()):
            tag = int(score[row].argmax())
            path = [tag]
            for t in range(length - 1, 0, -1):
                tag = int(backpointers[t - 1][row, tag])
                path.append(tag)
            paths.append(path[::-1])
        return paths


def word_emissions(token_scores: torch.Tensor, word_starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-aligned (batch, words, tags) scores at each word's first sub-token, and the word mask."""
    counts = word_starts.sum(dim=1)
    words = max(int(counts.max()) if counts.numel() else 0, 1)
    emissions = token_scores.new_zeros(token_scores.shape[0], words, token_scores.shape[-1])
    mask = torch.arange(words, device=token_scores.device)[None, :] < counts[:, None]
    emissions[mask] = token_scores[word_starts]
    return emissions, mask
