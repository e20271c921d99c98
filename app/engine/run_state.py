"""A swarm's run as its parts share it: the rows in memory, the budget, slots and deadline,
the stop and drain flags, the journal of its writes and what its workers' results say. The
runner's other parts (failure tolerance, the ends, the phase loop, the lifecycle) each hold
this one object; it holds none of them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from app.db.live_rows import live_subtask, live_swarm
from app.db.tables import Subtask, Swarm
from app.db.types import utcnow
from app.engine import dag
from app.engine.budget import SwarmBudget
from app.engine.journal import SwarmJournal
from app.engine.owned_swarm import EngineContext, EventRow, failure
from app.engine.synthesis import WorkerResult, concatenate
from app.states import Event, SubtaskKind, SubtaskStatus, SwarmStatus, move_swarm


class RunnerState:
    """One swarm: in-memory state is the authority while the lease is held; every change is
    written through the group-committing StateWriter (its journal), fenced by the lease
    epoch."""

    def __init__(self, ctx: EngineContext, swarm: Swarm, subtasks: list[Subtask], epoch: int,
                 rescues: int = 0) -> None:
        self.ctx = ctx
        # live rows: the runner reads and writes them ~150 times per subtask (live_rows.py)
        self.swarm: Swarm = live_swarm(swarm)
        self.epoch = epoch
        self.rescues = rescues
        self.spec: dict[str, Any] = self.swarm.spec
        self.limits: dict[str, Any] = self.spec["limits"]
        self.subs: dict[str, Subtask] = {}
        self.deps: dict[str, list[str]] = {}
        self._below: dict[str, int] | None = None  # `chain_below`, until the graph changes
        self.add_subtasks(subtasks)
        if self.swarm.unresolved_usd is None:  # a row built in memory without every default
            self.swarm.unresolved_usd = Decimal(0)
        # reservations die with the process that made them; spent is what the ledger settled
        # (a dead owner's attempts in flight included, at their reservations: takeover.py)
        self.budget = SwarmBudget(limit=self.swarm.budget_usd, spent=self.swarm.spent_usd)
        # limits.concurrency counts this swarm's gateway calls in flight, like the process's
        # and the tenant's slots (steps.slots): given back when an answer is in, not once the
        # subtask's result has committed
        self.call_slots = asyncio.Semaphore(int(self.limits["concurrency"]))
        # as many calls may be written ahead and wait for their slots as the slots take: fewer
        # throttle the calls to what that many commits pass (a quarter of 8 slots at 20 ms a
        # call kept 4 in flight); a crash bills those waiting at their reservations too
        self.ahead_slots = asyncio.Semaphore(int(self.limits["concurrency"]))
        self.deadline = time.monotonic() + float(self.limits["deadline_s"])
        self._stop = asyncio.Event()
        self._drain = asyncio.Event()
        self._stop_status: SwarmStatus | None = None
        self._stop_error: dict[str, Any] | None = None
        self.journal = SwarmJournal(ctx, self.swarm, epoch, self.budget)

    def add_subtasks(self, subs: Sequence[Subtask]) -> None:
        for s in map(live_subtask, subs):
            self.subs[s.name] = s
            self.deps[s.name] = list(s.depends_on)
        self._below = None

    def forget_subtasks(self, subs: Sequence[Subtask]) -> None:
        """Drop subtasks whose insert was refused (they never existed)."""
        for s in subs:
            self.subs.pop(s.name, None)
            self.deps.pop(s.name, None)
        self._below = None

    def chain_below(self) -> dict[str, int]:
        """`dag.chain_below` of the swarm's graph, computed once per change of it (only
        `add_subtasks` and `forget_subtasks` change `deps`): each tool turn asks it for its
        calls' priority, and a key of the graph's whole shape was O(agents) per turn."""
        if self._below is None:
            self._below = dag.chain_below(self.deps)
        return self._below

    # ---- control ------------------------------------------------------------------------

    def request_cancel(self) -> None:
        self.stop_with(SwarmStatus.cancelled, None)

    def drain(self) -> None:
        """Shutdown: launch nothing new; end once the calls in flight are committed, leaving
        the swarm unfinished for the next owner."""
        self._drain.set()

    def deadline_error(self) -> dict[str, Any]:
        return failure("deadline_exceeded", f"deadline of {self.limits['deadline_s']} s passed")

    def stop_with(self, status: SwarmStatus, err: dict[str, Any] | None) -> None:
        if not self._stop.is_set():
            self._stop_status, self._stop_error = status, err
            self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def draining(self) -> bool:
        return self._drain.is_set()

    async def stopped(self) -> None:
        """Returns once the swarm is stopping."""
        await self._stop.wait()

    async def drained(self) -> None:
        """Returns once the swarm is draining."""
        await self._drain.wait()

    @property
    def stop_status(self) -> SwarmStatus | None:
        """The end the first `stop_with` asked for (None while not stopping)."""
        return self._stop_status

    @property
    def stop_error(self) -> dict[str, Any] | None:
        return self._stop_error

    # ---- writes (journal.py: `self.journal`) ---------------------------------------------

    def event(self, event: Event) -> EventRow:
        return self.journal.event(event)

    def set_status(self, new: SwarmStatus) -> EventRow:
        return self.event(move_swarm(self.swarm, new, utcnow()))

    # ---- the swarm's workers and its result --------------------------------------------

    def worker_names(self) -> list[str]:
        return [n for n, s in self.subs.items() if s.kind == SubtaskKind.worker]

    def worker_results(self) -> list[WorkerResult]:
        """Succeeded workers' outputs in topological order (ties: request order)."""
        names = self.worker_names()
        deps = {n: [d for d in self.deps[n] if d in self.subs] for n in names}
        order = dag.topological_order(deps, sorted(names, key=lambda n: self.subs[n].position))
        return [WorkerResult(n, self.subs[n].output or "", self.subs[n].weight,
                             self.subs[n].truncated)
                for n in order if self.subs[n].status == SubtaskStatus.succeeded]

    def synthesizer(self) -> Subtask | None:
        """The swarm's synthesizer: laid out with a `synthesize` strategy; with `vote`, once
        the count found no majority (stored with it: a takeover finds both)."""
        strategy = self.spec["synthesis"]["strategy"]
        if strategy == "vote" and (self.swarm.vote or {}).get("outcome") != "no_majority":
            return None
        if strategy not in ("synthesize", "vote"):
            return None
        return next((s for s in self.subs.values() if s.kind == SubtaskKind.synthesizer), None)

    def combined(self, results: list[WorkerResult]) -> str | None:
        """The swarm's result without a synthesizer: its workers' results combined (a vote's
        winner is the result the phase loop's vote set)."""
        strategy = self.spec["synthesis"]["strategy"]
        if strategy == "concatenate":
            return concatenate(results)
        return self.swarm.result if strategy == "vote" else None
