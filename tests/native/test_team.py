"""The native kernel's team size (encoderkit.native.team): chosen by measured calls, never changing a result."""
from __future__ import annotations

import pytest
import torch

from encoderkit import native
from encoderkit.engine import engine_for
from encoderkit.native.team import PROBE_EVERY, WEIGHT, TeamSize
from test_native import kernel, reference_and_ours, sequences  # noqa: F401  (kernel: a fixture)


def warmed(team: TeamSize, tokens: int, full: float, one: float, wanted: int = 2) -> None:
    """Feed ``team`` two calls of each team size (the first of each is left out as cold)."""
    for threads, seconds in ((wanted, full), (wanted, full), (1, one), (1, one)):
        team.record(tokens, threads, seconds)


def test_one_thread_wanted_is_one_thread():
    assert TeamSize().pick(12, 1) == 1


def test_first_calls_measure_the_whole_team_then_one_thread():
    team = TeamSize()
    assert team.pick(12, 2) == 2  # nothing known: the caller's team
    team.record(12, 2, 0.002)  # cold: left out
    assert team.pick(12, 2) == 2
    team.record(12, 2, 0.002)
    assert team.pick(12, 2) == 1  # the whole team is known, one thread is not yet
    assert team.estimates() == {(TeamSize.size_class(12), 2): 0.002}


def test_the_faster_team_runs_and_the_other_is_probed_now_and_then():
    team = TeamSize()
    warmed(team, 12, full=0.002, one=0.003)
    picks = [team.pick(12, 2) for _ in range(3 * PROBE_EVERY)]
    assert picks.count(1) == 3 and picks.count(2) == 3 * PROBE_EVERY - 3  # one probe every PROBE_EVERY calls
    assert [i + 1 for i, p in enumerate(picks) if p == 1] == [PROBE_EVERY, 2 * PROBE_EVERY, 3 * PROBE_EVERY]


def test_contention_turns_the_choice_and_a_free_machine_turns_it_back():
    team = TeamSize()
    warmed(team, 12, full=0.002, one=0.003)
    team.record(12, 2, 0.200)  # a descheduled thread held the team at its barriers
    assert team.estimates()[TeamSize.size_class(12), 2] == pytest.approx(0.002 + WEIGHT * 0.198)
    assert team.pick(12, 2) == 1
    team.record(12, 2, 0.0021)  # a probe on a free machine: the estimate drops at once
    assert team.pick(12, 2) == 2


def test_sizes_of_call_are_measured_apart():
    team = TeamSize()
    warmed(team, 12, full=0.002, one=0.003)
    warmed(team, 200, full=0.009, one=0.006)
    assert TeamSize.size_class(12) != TeamSize.size_class(200)
    assert team.pick(12, 2) == 2 and team.pick(200, 2) == 1


def test_kernel_states_are_the_same_bits_on_one_and_two_threads(kernel, tmp_path, monkeypatch):
    """The team size is free to change because the result does not: each output is one thread's, in one order."""
    config, _, model = reference_and_ours("bert", tmp_path, hidden_size=128, intermediate_size=512,
                                          num_attention_heads=4)
    engine = engine_for(model, "fp32")
    ids, _ = sequences(config, [20, 11, 3])
    states = {}
    for threads in (1, 2):
        monkeypatch.setattr(TeamSize, "pick", lambda self, tokens, wanted, threads=threads: threads)
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            states[threads] = engine.pooled(ids)
        finally:
            torch.set_num_threads(before)
        assert native.kernel_of(model) is not None
    assert torch.equal(states[1], states[2])
