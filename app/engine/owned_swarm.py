"""What executing a subtask needs from the swarm this process owns (`OwnedSwarm`) and from its
process (`EngineContext`): the one interface between the runner, which owns a swarm while its
lease is held, and the code that runs its subtasks (execute, lifecycle, turns, calls). They
import this module, never the runner's parts."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Protocol

from app.config import Settings
from app.db.changes import TenantSettle
from app.db.tables import Subtask, Swarm
from app.engine.budget import SharedCap, SwarmBudget
from app.engine.synthesis import WorkerResult
from app.engine.tenancy import TenantGates
from app.engine.waiters import SwarmNotifier
from app.engine.writer import StateWriter
from app.gateway.client import GatewayClient
from app.pricing import PriceTable
from app.states import Event, SwarmStatus
from app.tools.registry import ToolRegistry

# rows handed to the StateWriter, by table
LedgerRow = dict[str, Any]  # gateway_calls: one attempt
EventRow = dict[str, Any]  # events: a numbered state change
WebhookRow = dict[str, Any]  # webhooks: a delivery made due
ToolRow = dict[str, Any]  # tool_calls: one tool call
TranscriptRow = dict[str, Any]  # transcript_messages: one message of a tool-using subtask
ToolRows = tuple[list[ToolRow], list[TranscriptRow]]


def failure(code: str, message: str, **details: Any) -> dict[str, Any]:
    """The `error` of a swarm or subtask as stored and shown: SPEC's code, message, details."""
    return {"code": code, "message": message, "details": details or None}


def failure_causes(errors: Mapping[str, dict[str, Any] | None]) -> dict[str, Any]:
    """`causes` (how many failed subtasks per error code) and `cause` (the first failed
    subtask's error, named): the details of a swarm that its subtasks' failures ended."""
    codes = Counter(str((e or {}).get("code", "unknown")) for e in errors.values())
    name, first = next(iter(errors.items()), ("", None))
    cause = {"subtask": name, "code": (first or {}).get("code", "unknown"),
             "message": (first or {}).get("message", "")}
    return {"causes": dict(codes), "cause": cause if name else None}


class Outcome(Enum):
    """How running one subtask ended, for the runner's scheduling."""

    succeeded = auto()  # its dependents may start
    failed = auto()  # counted against the failure tolerance; its dependents are skipped
    swarm_stopping = auto()  # it stopped the whole swarm; the swarm's end cancels it


@dataclass
class EngineContext:
    """What every runner in a process shares."""

    settings: Settings
    prices: PriceTable
    gateway: GatewayClient
    writer: StateWriter
    owner: str
    inflight: asyncio.Semaphore
    model_slots: dict[str, asyncio.Semaphore]
    daily: SharedCap | None = None
    tools: ToolRegistry | None = None
    tenants: TenantGates | None = None  # per-tenant in-flight slots and daily caps
    notifier: SwarmNotifier | None = None  # readers of this process's swarms

    def cap_for(self, tenant: str) -> SharedCap | None:
        """The shared caps a call of this tenant reserves against (global and/or tenant)."""
        return self.daily if self.tenants is None else self.tenants.cap(tenant)

    def tenant_slot(self, tenant: str) -> asyncio.Semaphore | None:
        """The tenant's in-flight slot in this process (None when unlimited)."""
        return None if self.tenants is None else self.tenants.slot(tenant)


class Journal(Protocol):
    """What happened to a swarm, as its subtasks report it: each write is queued for the group
    commit (engine/journal.py's SwarmJournal); how and when it is committed is the journal's."""

    async def commit(self, subs: Sequence[Subtask] = (), ledger: Sequence[LedgerRow] = (),
                     events: Sequence[EventRow] = (), new: Sequence[Subtask] = (),
                     webhook: WebhookRow | None = None, tools: ToolRows | None = None
                     ) -> None:
        """Written and durable (raises LeaseLost when fenced out)."""

    def submit(self, ledger: Sequence[LedgerRow]) -> asyncio.Future[None]:
        """Ledger rows queued now; the future resolves once they are durable."""

    def queue(self, subs: Sequence[Subtask], events: Sequence[EventRow]) -> asyncio.Future[None]:
        """A write queued now for the next commit (it does not linger); the future resolves
        once it is durable (or raises LeaseLost)."""

    def commit_soon(self, subs: Sequence[Subtask] = (), ledger: Sequence[LedgerRow] = (),
                    events: Sequence[EventRow] = (), tools: ToolRows | None = None) -> None:
        """A write nobody waits for (a later awaited write of the swarm commits after it)."""

    def started(self, sub: Subtask, event: EventRow) -> None:
        """A subtask's start, written with the swarm's next write."""

    def write_with_end(self, subs: Sequence[Subtask], ledger: Sequence[LedgerRow],
                       events: Sequence[EventRow]) -> None:
        """The swarm's last result, held for its end's commit."""

    def with_row(self, row: LedgerRow, settles: Sequence[TenantSettle]) -> None:
        """Tenant cap settlements committed with the first write that carries `row`."""


class OwnedSwarm(Protocol):
    """One swarm this process owns (holds its lease), as its subtasks see it: its rows in
    memory, its budget and deadline, its writes, and the way to stop it."""

    ctx: EngineContext
    swarm: Swarm
    spec: dict[str, Any]
    limits: dict[str, Any]
    subs: dict[str, Subtask]  # by name, in creation order
    deps: dict[str, list[str]]
    budget: SwarmBudget
    call_slots: asyncio.Semaphore  # limits.concurrency: this swarm's calls in flight
    # calls whose first attempt is written ahead and waiting for their slots (as many as
    # limits.concurrency): what a crash could bill at reservations for calls never sent
    ahead_slots: asyncio.Semaphore

    @property
    def deadline(self) -> float:
        """time.monotonic() at which the swarm's deadline passes (a takeover moves it)."""

    @property
    def journal(self) -> Journal:
        """Where the swarm's writes go (its state, ledger rows, events)."""

    def event(self, event: Event) -> EventRow: ...

    def answered(self, sub: Subtask) -> None: ...

    def last_answer(self, sub: Subtask) -> bool: ...

    def stop_with(self, status: SwarmStatus, err: dict[str, Any] | None) -> None: ...

    @property
    def stopping(self) -> bool: ...

    def failing(self, name: str, error: dict[str, Any]) -> None: ...

    def deadline_error(self) -> dict[str, Any]: ...

    def add_subtasks(self, subs: Sequence[Subtask]) -> None: ...

    def forget_subtasks(self, subs: Sequence[Subtask]) -> None: ...

    def chain_below(self) -> dict[str, int]:
        """Each subtask's `dag.chain_below` in the swarm's graph as it is now."""

    def worker_names(self) -> list[str]: ...

    def worker_results(self) -> list[WorkerResult]: ...
