"""The state machine alone: every allowed and refused transition, terminal sets."""

from __future__ import annotations

import itertools

import pytest

from app.states import (
    SUBTASK_TRANSITIONS,
    SWARM_TRANSITIONS,
    InvalidTransition,
    SubtaskStatus,
    SwarmStatus,
    subtask_transition,
    swarm_transition,
)

S, T = SwarmStatus, SubtaskStatus


def test_terminal_states_have_no_way_out() -> None:
    assert {s for s in S if s.terminal} == {S.succeeded, S.failed, S.cancelled}
    assert {t for t in T if t.terminal} == {T.succeeded, T.failed, T.skipped, T.cancelled}
    assert all(not SWARM_TRANSITIONS[s] for s in S if s.terminal)
    assert all(not SUBTASK_TRANSITIONS[t] for t in T if t.terminal)


def test_a_swarm_moves_forward_only() -> None:
    path = [S.queued, S.planning, S.running, S.synthesizing, S.succeeded]
    for a, b in itertools.pairwise(path):
        assert swarm_transition(a, b) is b
    for a, b in [(S.running, S.planning), (S.synthesizing, S.running), (S.queued, S.queued),
                 (S.succeeded, S.failed), (S.queued, S.synthesizing)]:
        with pytest.raises(InvalidTransition, match=f"{a} -> {b}"):
            swarm_transition(a, b)


@pytest.mark.parametrize("current", [S.queued, S.planning, S.running, S.synthesizing])
def test_every_active_swarm_can_fail_or_be_cancelled(current: SwarmStatus) -> None:
    assert swarm_transition(current, S.failed) is S.failed
    assert swarm_transition(current, S.cancelled) is S.cancelled


def test_subtask_transitions_including_takeover() -> None:
    assert subtask_transition(T.pending, T.running) is T.running
    assert subtask_transition(T.running, T.pending) is T.pending  # a takeover
    for end in (T.succeeded, T.failed, T.cancelled):
        assert subtask_transition(T.running, end) is end
    assert subtask_transition(T.pending, T.skipped) is T.skipped
    for a, b in [(T.pending, T.succeeded), (T.running, T.skipped), (T.succeeded, T.running),
                 (T.skipped, T.pending)]:
        with pytest.raises(InvalidTransition):
            subtask_transition(a, b)
