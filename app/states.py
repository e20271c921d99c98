"""The one state machine: swarm, subtask and webhook-delivery statuses, gateway attempts'
ledger outcomes, their allowed transitions, and the moves that apply one to a row (stamping
its timestamps) and return the event it writes. Every status write in the service goes
through a move here; no other module spells a status or outcome as a string (SQL status
lists are rendered from these enums with `sql_in`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple, Protocol


class SwarmStatus(StrEnum):
    queued = "queued"
    planning = "planning"
    awaiting_approval = "awaiting_approval"  # parked: nothing runs, no lease (SPEC §14)
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


# running, between queued and the end (a lease keeps it)
ACTIVE_SWARM = (SwarmStatus.planning, SwarmStatus.running, SwarmStatus.synthesizing)
# what a tenant's max_active_swarms counts: the active, the queued and the parked
COUNTED_SWARM = (SwarmStatus.queued, SwarmStatus.awaiting_approval, *ACTIVE_SWARM)
# what an engine may claim: a queued swarm, or an active one whose lease lapsed
CLAIMABLE_SWARM = (SwarmStatus.queued, *ACTIVE_SWARM)
TERMINAL_SWARM = frozenset({SwarmStatus.succeeded, SwarmStatus.failed, SwarmStatus.cancelled})
TERMINAL_SUBTASK = frozenset(
    {SubtaskStatus.succeeded, SubtaskStatus.failed, SubtaskStatus.skipped, SubtaskStatus.cancelled}
)

_S = SwarmStatus
SWARM_TRANSITIONS: dict[SwarmStatus, frozenset[SwarmStatus]] = {
    _S.queued: frozenset({_S.planning, _S.awaiting_approval, _S.running, _S.failed,
                          _S.cancelled}),
    _S.planning: frozenset({_S.awaiting_approval, _S.running, _S.failed, _S.cancelled}),
    # approved: back in the queue for an engine to claim; rejected; timed out
    _S.awaiting_approval: frozenset({_S.queued, _S.failed, _S.cancelled}),
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


class WebhookState(StrEnum):
    pending = "pending"  # due (now or at next_attempt_at)
    delivered = "delivered"  # the receiver answered 2xx
    failed = "failed"  # given up: no 2xx within the retry window

    @property
    def terminal(self) -> bool:
        return self is not WebhookState.pending


_W = WebhookState
WEBHOOK_TRANSITIONS: dict[WebhookState, frozenset[WebhookState]] = {
    # pending -> pending: an attempt failed and another is scheduled
    _W.pending: frozenset({_W.pending, _W.delivered, _W.failed}),
    _W.delivered: frozenset(),
    _W.failed: frozenset(),
}


class AttemptOutcome(StrEnum):
    """A gateway attempt's ledger outcome (SPEC §4): written ahead `in_flight`, then settled
    once. The seven answers are the gateway client's classification of an attempt."""

    in_flight = "in_flight"  # written ahead: sent (or about to be), no answer settled yet
    ok = "ok"
    rate_limited = "rate_limited"
    server_error = "server_error"
    timeout = "timeout"
    invalid_response = "invalid_response"
    client_error = "client_error"
    connection_error = "connection_error"
    unknown = "unknown"  # the answer was lost (crash, cancel mid-call): billed at its reservation
    cancelled = "cancelled"  # written ahead but never sent: costs nothing

    @property
    def settled(self) -> bool:
        return self is not AttemptOutcome.in_flight


_A = AttemptOutcome
# what the gateway client classifies an attempt as: its answer, or the lack of one
ANSWERED = (_A.ok, _A.rate_limited, _A.server_error, _A.timeout, _A.invalid_response,
            _A.client_error, _A.connection_error)
FAILED_ATTEMPT = ANSWERED[1:]  # the failures, each one a retry's reason
# rows that hold no answer: a swarm whose calls end only so made no progress
UNANSWERED = frozenset({_A.in_flight, _A.unknown, _A.cancelled})
NOT_BILLED = (_A.in_flight, _A.cancelled)  # no cost (yet): left out of spend reports
ATTEMPT_TRANSITIONS: dict[AttemptOutcome, frozenset[AttemptOutcome]] = {
    _A.in_flight: frozenset({*ANSWERED, _A.unknown, _A.cancelled}),
    **{o: frozenset() for o in _A if o is not _A.in_flight},
}


class ToolCallStatus(StrEnum):
    """How one MCP tool call ended: its tool ledger row's status and metric label (SPEC §9)."""

    ok = "ok"
    error = "error"
    timeout = "timeout"


def sql_in(values: Iterable[StrEnum]) -> str:
    """A status list as SQL renders it, for statements written as text: `'a', 'b'`."""
    return ", ".join(f"'{v.value}'" for v in values)


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


def attempt_transition(current: AttemptOutcome, new: AttemptOutcome) -> AttemptOutcome:
    """Return `new` when an attempt's ledger row may be settled so from `current`, else
    raise (a row is settled once, from `in_flight`)."""
    if new not in ATTEMPT_TRANSITIONS[current]:
        raise InvalidTransition(f"attempt {current} -> {new}")
    return new


def webhook_transition(current: WebhookState, new: WebhookState) -> WebhookState:
    """Return `new` when a delivery may move there from `current`, else raise."""
    if new not in WEBHOOK_TRANSITIONS[current]:
        raise InvalidTransition(f"webhook {current} -> {new}")
    return new


# ---- moves: a transition applied to a row ------------------------------------------------


class Event(NamedTuple):
    """An event a move produces, before the swarm numbers it (SPEC: SSE event names)."""

    type: str
    data: dict[str, Any]


class SwarmState(Protocol):
    status: SwarmStatus
    started_at: datetime | None
    finished_at: datetime | None


class SubtaskState(Protocol):
    name: str
    status: SubtaskStatus
    error: dict[str, Any] | None
    started_at: datetime | None
    finished_at: datetime | None


def move_swarm(swarm: SwarmState, new: SwarmStatus, now: datetime, **data: Any) -> Event:
    """Move a swarm: it starts when it leaves `queued` and finishes when it ends. A terminal
    move returns `swarm.completed` (with `data`: error, cancelled subtasks), any other
    `swarm.status`."""
    swarm.status = swarm_transition(swarm.status, new)
    if swarm.started_at is None and new in (SwarmStatus.planning, SwarmStatus.running):
        swarm.started_at = now
    if new.terminal:
        swarm.finished_at = now
        return Event("swarm.completed", {"status": new.value, **data})
    if new is SwarmStatus.awaiting_approval:  # its data: the estimate
        return Event("swarm.awaiting_approval", {"status": new.value, **data})
    return Event("swarm.status", {"status": new.value})


def amend_end(swarm: SwarmState, new: SwarmStatus) -> None:
    """Replace a swarm's end whose write the database refused (so never committed) by
    another end; its timestamps stand."""
    if not (swarm.status.terminal and new.terminal):
        raise InvalidTransition(f"swarm end {swarm.status} -> {new}")
    swarm.status = new


_SUBTASK_EVENTS = {SubtaskStatus.running: "subtask.started",
                   SubtaskStatus.succeeded: "subtask.succeeded",
                   SubtaskStatus.failed: "subtask.failed",
                   SubtaskStatus.skipped: "subtask.skipped"}


def move_subtask(sub: SubtaskState, new: SubtaskStatus, now: datetime, **data: Any
                 ) -> Event | None:
    """Move a subtask: starting clears what an earlier attempt left, ending stamps the time.
    Returns its event (`data` after the name), or None: a cancelled subtask is listed by
    `swarm.completed`, and a takeover's return to `pending` is no event of its own."""
    sub.status = subtask_transition(sub.status, new)
    if new is SubtaskStatus.running:
        sub.started_at, sub.finished_at, sub.error = now, None, None
    elif new.terminal:
        sub.finished_at = now
    kind = _SUBTASK_EVENTS.get(new)
    return None if kind is None else Event(kind, {"name": sub.name, **data})


def retract_subtask(sub: SubtaskState, back: SubtaskStatus) -> None:
    """Forget a subtask's move from `back` whose write the database refused (it never
    happened): the subtask is at `back` again, its end unstamped."""
    if sub.status not in SUBTASK_TRANSITIONS[back]:
        raise InvalidTransition(f"subtask {back} -> {sub.status} is no move to retract")
    sub.status, sub.finished_at = back, None
