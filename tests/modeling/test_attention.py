"""The unpadded training path's attention groups (modeling/attention.py)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from encoderkit import EncoderConfig, build_model
from encoderkit.modeling import packing as attention_module
from encoderkit.modeling import encoder as encoder_module
from encoderkit.modeling.packing import Packing, length_groups


def brute_force_cost(lengths: list[int], overhead: float) -> float:
    """The cheapest total of count * longest**2 + overhead over every way to cut the sorted lengths."""
    ordered = sorted(lengths, reverse=True)
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=len(ordered) - 1):
        groups, current = [], [ordered[0]]
        for length, cut in zip(ordered[1:], cuts):
            if cut:
                groups.append(current)
                current = []
            current.append(length)
        groups.append(current)
        best = min(best, sum(len(g) * max(g) ** 2 + overhead for g in groups))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_length_groups_finds_the_cheapest_split(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, size=9)
    lengths[:3] = lengths[3]  # runs of equal length must stay together only when that is cheapest
    overhead = float(rng.choice([0, 50, 400, 4096]))
    groups = length_groups(lengths, overhead)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(lengths)))  # each sequence once
    cost = sum(len(g) * int(lengths[g].max()) ** 2 + overhead for g in groups)
    assert cost == pytest.approx(brute_force_cost(lengths.tolist(), overhead))


def test_length_groups_hand_computed() -> None:
    # Together 384 and 380 cost 2 * 384^2 = 294912; apart 384^2 + 380^2 = 291856 plus one more overhead,
    # so they part when the overhead is below 3056.
    lengths = np.array([384, 380])
    assert [g.tolist() for g in length_groups(lengths, 3000)] == [[0], [1]]
    assert [g.tolist() for g in length_groups(lengths, 3100)] == [[0, 1]]
    assert [g.tolist() for g in length_groups(np.array([5, 5, 5]), 0)] == [[0, 1, 2]]


def test_packing_round_trip_with_left_padding_and_an_empty_row() -> None:
    """Attention groups need no particular padding side; an all-padding row takes part in no group."""
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 1, 0, 0]])
    packing = Packing.from_mask(mask, torch.float32)
    assert sum(g.count for g in packing.groups) == 3
    states = torch.randn(4, 5, 6)
    tokens = packing.unpad(states)
    assert tokens.shape == (int(mask.sum()), 6)
    assert torch.equal(packing.pad(tokens), states * mask[..., None])


@pytest.mark.parametrize("overhead", [0, 4096])
def test_grouped_attention_equals_padded_attention_with_left_padding(overhead: int, monkeypatch) -> None:
    """Rows padded on the left, right or both give the same real-token states as the padded path."""
    monkeypatch.setattr(attention_module, "GROUP_OVERHEAD", overhead)
    config = EncoderConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    model = build_model(config).eval()
    ids = torch.randint(5, 50, (4, 12))
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[0, :7] = 0
    mask[1, 9:] = 0
    mask[2, :2] = 0
    mask[2, 10:] = 0
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    outputs = {}
    for unpad in (False, True):
        monkeypatch.setattr(encoder_module, "_worth_unpadding", lambda m, unpad=unpad: unpad)
        with torch.no_grad():
            outputs[unpad] = model(ids, attention_mask=mask, position_ids=positions).last_hidden_state
    real = mask.bool()
    assert (outputs[True] - outputs[False])[real].abs().max() < 1e-5
