"""The CRF against brute-force enumeration of every tag sequence, and the IOB2 constraints by hand."""
from __future__ import annotations

import itertools

import pytest
import torch

from encoderkit.modeling.crf import CRF, FORBIDDEN, iob2_constraints, word_emissions


def brute_force(crf: CRF, emissions: torch.Tensor, length: int) -> dict[tuple[int, ...], float]:
    """Score of every tag sequence of one sequence's first ``length`` words."""
    transitions, start, end = crf._scores()
    scores = {}
    for tags in itertools.product(range(crf.num_tags), repeat=length):
        score = start[tags[0]] + end[tags[-1]] + sum(emissions[t, tag] for t, tag in enumerate(tags))
        score = score + sum(transitions[a, b] for a, b in zip(tags, tags[1:]))
        scores[tags] = float(score)
    return scores


@pytest.mark.parametrize("labels", [None, ["O", "B-PER", "I-PER", "B-LOC"]])
def test_partition_likelihood_marginals_and_viterbi_equal_enumeration(labels) -> None:
    torch.manual_seed(0)
    tags = 4
    crf = CRF(tags, labels)
    with torch.no_grad():
        crf.transitions.normal_(); crf.start.normal_(); crf.end.normal_()
    lengths = [5, 3, 1]
    emissions = torch.randn(3, 5, tags, dtype=torch.float64)
    crf = crf.double()
    mask = torch.arange(5)[None, :] < torch.tensor(lengths)[:, None]
    gold = torch.randint(0, tags, (3, 5))
    log_z = crf.log_partition(emissions, mask)
    likelihood = crf.log_likelihood(emissions, gold, mask)
    marginals = crf.marginals(emissions, mask)
    paths = crf.decode(emissions, mask)
    for row, length in enumerate(lengths):
        scores = brute_force(crf, emissions[row], length)
        values = torch.tensor(list(scores.values()), dtype=torch.float64)
        assert float(log_z[row]) == pytest.approx(float(torch.logsumexp(values, 0)), abs=1e-9)
        gold_tags = tuple(gold[row, :length].tolist())
        assert float(likelihood[row]) == pytest.approx(scores[gold_tags] - float(torch.logsumexp(values, 0)), abs=1e-9)
        assert tuple(paths[row]) == max(scores, key=scores.get)
        probabilities = torch.softmax(values, 0)
        for t in range(length):
            for k in range(tags):
                expected = sum(float(p) for seq, p in zip(scores, probabilities) if seq[t] == k)
                assert float(marginals[row, t, k]) == pytest.approx(expected, abs=1e-9)
        assert float(marginals[row, length:].abs().sum()) == 0.0


def test_iob2_constraints_by_hand() -> None:
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    allowed, first = iob2_constraints(labels)
    assert first.tolist() == [True, True, False, True, False]  # no sequence starts inside an entity
    # I-PER may follow only B-PER or I-PER; I-LOC only B-LOC or I-LOC; everything else is free.
    assert allowed[:, 2].tolist() == [False, True, True, False, False]
    assert allowed[:, 4].tolist() == [False, False, False, True, True]
    assert allowed[:, [0, 1, 3]].all()
    assert iob2_constraints(["NOUN", "VERB"]) is None  # not a BIO tag set: no constraints


def test_constrained_decoding_never_breaks_an_entity() -> None:
    labels = ["O", "B-PER", "I-PER"]
    crf = CRF(3, labels)
    emissions = torch.tensor([[[0.0, 0.0, 5.0], [5.0, 0.0, 0.0], [0.0, 0.0, 5.0]]])  # wants I-PER, O, I-PER
    path = crf.decode(emissions, torch.ones(1, 3, dtype=torch.bool))[0]
    assert path[0] != 2 and all(not (b == 2 and a == 0) for a, b in zip(path, path[1:]))
    assert float(crf.transition_penalty[0, 2]) == FORBIDDEN


def test_word_emissions_gathers_first_subtokens_left_aligned() -> None:
    scores = torch.arange(2 * 5 * 1, dtype=torch.float32).view(2, 5, 1)
    starts = torch.tensor([[False, True, False, True, False], [False, True, True, True, True]])
    emissions, mask = word_emissions(scores, starts)
    assert mask.tolist() == [[True, True, False, False], [True, True, True, True]]
    assert emissions[..., 0].tolist() == [[1.0, 3.0, 0.0, 0.0], [6.0, 7.0, 8.0, 9.0]]
