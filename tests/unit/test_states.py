"""The state machine alone: every allowed and refused transition, terminal sets, and the
moves that stamp a row's times and return its event."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.states import (
    ANSWERED,
    CLAIMABLE_SWARM,
    FAILED_ATTEMPT,
    SUBTASK_TRANSITIONS,
    SWARM_TRANSITIONS,
    UNANSWERED,
    AttemptOutcome,
    Event,
    InvalidTransition,
    SubtaskStatus,
    SwarmStatus,
    WebhookState,
    amend_end,
    attempt_transition,
    move_subtask,
    move_swarm,
    retract_subtask,
    sql_in,
    subtask_transition,
    swarm_transition,
    webhook_transition,
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


def test_webhook_deliveries_end_once() -> None:
    W = WebhookState
    assert webhook_transition(W.pending, W.pending) is W.pending  # a retry is scheduled
    assert webhook_transition(W.pending, W.delivered) is W.delivered
    assert webhook_transition(W.pending, W.failed) is W.failed
    for a, b in [(W.delivered, W.pending), (W.failed, W.delivered), (W.delivered, W.delivered)]:
        with pytest.raises(InvalidTransition, match="webhook"):
            webhook_transition(a, b)
    assert {w for w in W if w.terminal} == {W.delivered, W.failed}


@dataclass
class _Swarm:
    status: SwarmStatus = S.queued
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass
class _Sub:
    name: str = "a"
    status: SubtaskStatus = T.pending
    error: dict[str, Any] | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(seconds=5)


def test_a_swarm_move_stamps_its_times_and_returns_its_event() -> None:
    swarm = _Swarm()
    assert move_swarm(swarm, S.planning, NOW) == Event("swarm.status", {"status": "planning"})
    assert (swarm.status, swarm.started_at, swarm.finished_at) == (S.planning, NOW, None)
    move_swarm(swarm, S.running, LATER)
    assert swarm.started_at == NOW  # started once
    ev = move_swarm(swarm, S.failed, LATER, error={"code": "x"}, cancelled=["b"])
    assert ev == Event("swarm.completed",
                       {"status": "failed", "error": {"code": "x"}, "cancelled": ["b"]})
    assert swarm.finished_at == LATER


def test_a_queued_swarm_cancelled_never_started() -> None:
    swarm = _Swarm()
    assert move_swarm(swarm, S.cancelled, NOW).type == "swarm.completed"
    assert (swarm.started_at, swarm.finished_at) == (None, NOW)


def test_a_refused_move_changes_nothing() -> None:
    swarm = _Swarm(status=S.succeeded, finished_at=NOW)
    with pytest.raises(InvalidTransition):
        move_swarm(swarm, S.running, LATER)
    assert (swarm.status, swarm.finished_at) == (S.succeeded, NOW)
    sub = _Sub(status=T.skipped)
    with pytest.raises(InvalidTransition):
        move_subtask(sub, T.running, LATER)
    assert (sub.status, sub.started_at) == (T.skipped, None)


def test_a_subtask_move_stamps_and_names_its_event() -> None:
    sub = _Sub(error={"code": "old attempt"}, finished_at=NOW)
    assert move_subtask(sub, T.running, NOW, kind="worker") == Event(
        "subtask.started", {"name": "a", "kind": "worker"})
    assert (sub.started_at, sub.finished_at, sub.error) == (NOW, None, None)
    assert move_subtask(sub, T.succeeded, LATER, latency_ms=5.0) == Event(
        "subtask.succeeded", {"name": "a", "latency_ms": 5.0})
    assert sub.finished_at == LATER


def test_takeover_and_cancel_write_no_subtask_event() -> None:
    sub = _Sub(status=T.running, started_at=NOW)
    assert move_subtask(sub, T.pending, LATER) is None  # back for the next owner
    assert (sub.status, sub.started_at) == (T.pending, NOW)
    assert move_subtask(sub, T.cancelled, LATER) is None  # listed by swarm.completed
    assert sub.finished_at == LATER
    skipped = _Sub()
    assert move_subtask(skipped, T.skipped, NOW, reason="r") == Event(
        "subtask.skipped", {"name": "a", "reason": "r"})


def test_an_attempt_is_written_ahead_then_settled_once() -> None:
    A = AttemptOutcome
    # SPEC §4's names, exact
    assert [o.value for o in A] == [
        "in_flight", "ok", "rate_limited", "server_error", "timeout", "invalid_response",
        "client_error", "connection_error", "unknown", "cancelled"]
    for outcome in A:
        if outcome is not A.in_flight:
            assert attempt_transition(A.in_flight, outcome) is outcome
            assert outcome.settled
            for again in A:  # a settled row is never settled again
                with pytest.raises(InvalidTransition):
                    attempt_transition(outcome, again)
    with pytest.raises(InvalidTransition):
        attempt_transition(A.in_flight, A.in_flight)
    assert set(ANSWERED) | UNANSWERED == set(A)
    assert A.ok not in FAILED_ATTEMPT and set(FAILED_ATTEMPT) < set(ANSWERED)


def test_sql_status_lists_are_rendered_from_the_enums() -> None:
    assert sql_in(CLAIMABLE_SWARM) == "'queued', 'planning', 'running', 'synthesizing'"


def test_a_refused_success_is_retracted_and_a_refused_end_amended() -> None:
    sub = _Sub(status=T.running, started_at=NOW)
    move_subtask(sub, T.succeeded, LATER)
    retract_subtask(sub, T.running)  # its write was refused: it never happened
    assert (sub.status, sub.finished_at, sub.started_at) == (T.running, None, NOW)
    with pytest.raises(InvalidTransition):
        retract_subtask(_Sub(status=T.succeeded), T.pending)  # no such move to retract
    swarm = _Swarm(status=S.running)
    move_swarm(swarm, S.succeeded, LATER)
    amend_end(swarm, S.failed)
    assert (swarm.status, swarm.finished_at) == (S.failed, LATER)
    with pytest.raises(InvalidTransition):
        amend_end(_Swarm(status=S.running), S.failed)  # not ended: a move, not an amendment
