"""The one state machine: swarm and subtask statuses and their allowed transitions."""

from __future__ import annotations

from enum import StrEnum


class SwarmStatus(StrEnum):
    queued = "queued"
    planning = "planning"
    running = "running"
    synthesizing = "synthesizing"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_SWARM


class SubtaskStatus(StrEnum):
    pending = "pending"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    skipped = "skipped"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_SUBTASK


class SubtaskKind(StrEnum):
    planner = "planner"
    worker = "worker"
    compressor = "compressor"
    synthesizer = "synthesizer"


TERMINAL_SWARM = frozenset({SwarmStatus.succeeded, SwarmStatus.failed, SwarmStatus.cancelled})
TERMINAL_SUBTASK = frozenset(
    {SubtaskStatus.succeeded, SubtaskStatus.failed, SubtaskStatus.skipped, SubtaskStatus.cancelled}
)

_S = SwarmStatus
SWARM_TRANSITIONS: dict[SwarmStatus, frozenset[SwarmStatus]] = {
    _S.queued: frozenset({_S.planning, _S.running, _S.failed, _S.cancelled}),
    _S.planning: frozenset({_S.running, _S.failed, _S.cancelled}),
    _S.running: frozenset({_S.synthesizing, _S.succeeded, _S.failed, _S.cancelled}),
    _S.synthesizing: frozenset({_S.succeeded, _S.failed, _S.cancelled}),
    _S.succeeded: frozenset(),
    _S.failed: frozenset(),
    _S.cancelled: frozenset(),
}

_T = SubtaskStatus
SUBTASK_TRANSITIONS: dict[SubtaskStatus, frozenset[SubtaskStatus]] = {
    # running -> pending is the takeover of a crashed process's in-flight subtask
    _T.pending: frozenset({_T.running, _T.skipped, _T.cancelled, _T.failed}),
    _T.running: frozenset({_T.succeeded, _T.failed, _T.cancelled, _T.pending}),
    _T.succeeded: frozenset(),
    _T.failed: frozenset(),
    _T.skipped: frozenset(),
    _T.cancelled: frozenset(),
}


class InvalidTransition(Exception):
    """A status change the state machine does not allow (a bug, never client input)."""


def swarm_transition(current: SwarmStatus, new: SwarmStatus) -> SwarmStatus:
    """Return `new` when the swarm may move there from `current`, else raise."""
    if new not in SWARM_TRANSITIONS[current]:
        raise InvalidTransition(f"swarm {current} -> {new}")
    return new


def subtask_transition(current: SubtaskStatus, new: SubtaskStatus) -> SubtaskStatus:
    """Return `new` when the subtask may move there from `current`, else raise."""
    if new not in SUBTASK_TRANSITIONS[current]:
        raise InvalidTransition(f"subtask {current} -> {new}")
    return new
