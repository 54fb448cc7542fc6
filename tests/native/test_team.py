"""The native kernel's team size (encoderkit.native.team): chosen by measured calls, never changing a result."""
from __future__ import annotations

import pytest
import torch

from encoderkit import native
from encoderkit.engine import engine_for
from encoderkit.native.team import PROBE_FIRST, TEAM_MARGIN, WINDOW, TeamSize
from test_native import kernel, reference_and_ours, sequences  # noqa: F401  (kernel: a fixture)


def calls(team: TeamSize, tokens: int, seconds: dict[int, float], count: int, wanted: int = 2) -> list[int]:
    """``count`` calls, each taking ``seconds[threads]`` on the team ``team`` picks; the picks."""
    picks = []
    for _ in range(count):
        threads = team.pick(tokens, wanted)
        team.record(tokens, threads, seconds[threads])
        picks.append(threads)
    return picks


def test_one_thread_wanted_is_one_thread():
    assert TeamSize().pick(12, 1) == 1


def test_each_team_is_measured_first_then_the_faster_runs():
    team = TeamSize()
    picks = calls(team, 12, {2: 0.002, 1: 0.003}, 10)
    assert picks == [2, 2, 2, 1, 1, 1, 2, 2, 2, 2]  # a cold call and two more of each, then the faster
    assert team.estimates() == {(TeamSize.size_class(12), 2): 0.002, (TeamSize.size_class(12), 1): 0.003}


def test_the_team_runs_only_where_clearly_faster():
    """Two threads at 0.87 of one thread's time (a busy machine's team) are not worth their tail: one thread runs."""
    team = TeamSize()
    assert calls(team, 12, {2: 0.0026, 1: 0.0030}, 10)[-1] == 1
    assert 0.0026 >= TEAM_MARGIN * 0.0030


def test_probes_of_the_other_team_grow_apart_while_nothing_changes():
    team = TeamSize()
    picks = calls(team, 12, {2: 0.002, 1: 0.003}, 6 + PROBE_FIRST * 15)
    probes = [i + 1 for i, p in enumerate(picks) if p == 1 and i >= 6]
    assert probes[:4] == [PROBE_FIRST, 2 * PROBE_FIRST, 4 * PROBE_FIRST, 8 * PROBE_FIRST]


def test_an_outlier_does_not_turn_the_choice():
    team = TeamSize()
    calls(team, 12, {2: 0.002, 1: 0.003}, 8)
    team.record(12, 2, 0.200)  # one descheduled call
    assert team.pick(12, 2) == 2


def test_contention_turns_the_choice_and_a_free_machine_turns_it_back():
    team = TeamSize()
    calls(team, 12, {2: 0.002, 1: 0.003}, 8)
    busy = calls(team, 12, {2: 0.040, 1: 0.005}, WINDOW)  # the team's calls slow down: its median crosses
    assert busy[-1] == 1
    later = calls(team, 12, {2: 0.040, 1: 0.005}, 3 * PROBE_FIRST)
    assert later.count(2) <= 3  # probes only
    free = calls(team, 12, {2: 0.002, 1: 0.003}, PROBE_FIRST * (WINDOW + 1) * 4)
    assert free[-PROBE_FIRST:] == [2] * PROBE_FIRST


def test_sizes_of_call_are_measured_apart():
    team = TeamSize()
    calls(team, 12, {2: 0.002, 1: 0.003}, 8)
    calls(team, 200, {2: 0.009, 1: 0.006}, 8)
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
