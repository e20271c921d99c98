"""Calls whose first attempt is written before their turn: a new swarm's first wave (written
with its creation) and the synthesizer prepared on the workers' answers (written with the last
results). Each saves a commit on the swarm's critical path."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from app.db.create import Ahead
from app.db.tables import Subtask
from app.engine.calls import CallMeter
from app.engine.inputs import Input, SubtaskInputs
from app.engine.lifecycle import CALL_FAILURES, SubtaskSteps
from app.engine.owned_swarm import LedgerRow, OwnedSwarm
from app.engine.subtask_rows import PLANNER
from app.engine.synthesis import WorkerResult
from app.engine.tenancy import TenantDailyCap
from app.engine.turns import agent_tools, openai_tools
from app.engine.writer import WriteRejected
from app.states import SubtaskKind, SubtaskStatus
from app.tools.model import ToolInfo


@dataclass(frozen=True, slots=True)
class Prepared:
    """The synthesizer's call as prepared on the workers' answers: the results it was built
    on, its messages, and its meter, whose first attempt is written ahead."""

    results: list[WorkerResult]
    messages: list[dict[str, str]]
    meter: CallMeter


@dataclass(frozen=True, slots=True)
class FirstCall:
    """A worker's first attempt written with its swarm's creation: its messages, its meter and,
    for a tool-using worker, the tools its first turn offers (its turn loop's for the
    subtask: the reservation was sized on them)."""

    messages: list[dict[str, str]]
    meter: CallMeter
    tools: list[ToolInfo] | None = None


class WrittenAhead:
    """A swarm's calls written ahead: the first wave's (by worker) and the prepared
    synthesizer's; `SubtaskExecutor` sends them at their turn."""

    def __init__(self, owned: OwnedSwarm, steps: SubtaskSteps, inputs: SubtaskInputs) -> None:
        self.owned = owned
        self.steps = steps
        self.inputs = inputs
        self._prepared: asyncio.Task[Prepared | None] | None = None
        # workers whose first attempt's row was written with the swarm's creation
        self._first: dict[str, FirstCall] = {}

    def first_of(self, name: str) -> FirstCall | None:
        """The worker's first attempt written with the creation, taken."""
        return self._first.pop(name, None)

    @property
    def preparing(self) -> bool:
        """A synthesizer's call is prepared (or being written ahead)."""
        return self._prepared is not None

    def first_wave(self) -> Ahead:
        """The first attempts of the workers a new swarm sends first (no dependency; in launch
        order, as many as its concurrency; a tool-using worker's first turn, with the tools it
        offers), opened now for the creation's statement to write: their calls are then sent as
        soon as the swarm starts, with no write-ahead commit of their own to wait for (a 1-agent
        swarm makes one commit where it would make two). The tenant's daily cap, when it has
        one, is asked in that statement too. Until it is sent, each is released like any row
        written ahead; if the creation fails, nothing was written. None behind the process-wide
        daily cap (a statement of its own), nor with the latency devices off, nor past what the
        swarm's budget holds now; nor when the tenant's cap would be asked by a creation that
        holds the tenant's admission lock (its bucket's row, its count's lock) to its commit:
        the cap's day row, which every group commit settling the tenant's calls holds through
        its own commit, would then queue all the tenant's creations behind each settlement
        (docs/decisions/0030-quota-checked-creation.md); its calls reserve in the cap's batches
        and are written ahead as any call is."""
        owned = self.owned
        tenant = owned.swarm.tenant
        cap = owned.ctx.cap_for(tenant)
        settings = owned.ctx.settings
        if (not settings.latency_devices or PLANNER in owned.subs
                or (cap is not None and (not isinstance(cap, TenantDailyCap)
                                         or settings.tenant_limits(tenant).admission_locks))):
            return Ahead([])
        rows: list[LedgerRow] = []
        ready = sorted((s for s in owned.subs.values() if s.kind == SubtaskKind.worker
                        and s.status == SubtaskStatus.pending and not s.depends_on),
                       key=lambda s: s.position)
        for sub in ready[:int(owned.limits["concurrency"])]:
            messages = self.inputs.messages(sub, [])
            tools = agent_tools(owned, sub) if sub.tools else None
            # sized on the request the turn loop sends: no `tools` field without any
            meter = self.steps.meter(sub, messages, 1, openai_tools(tools) if tools else None)
            row = meter.reserve_ahead(cap_asked=cap is not None)
            if row is None:
                break
            rows.append(row)
            self._first[sub.name] = FirstCall(messages, meter, tools)
            # counted once the swarm runs (`first_wave_opened`): the creation's answer and its
            # row say, as for any subtask not started, that no attempt was made yet
            sub.attempts -= 1
        return Ahead(rows, cap.ask(rows) if cap is not None and rows else None)

    def first_wave_opened(self, ahead: Ahead | None) -> None:
        """The swarm runs, its creation stored: its first wave's attempts count, each with
        its reservation against the tenant's cap; one the cap refused was never written, and
        is prepared again at its turn."""
        checks = ahead.checks if ahead is not None else None
        cap = self.owned.ctx.cap_for(self.owned.swarm.tenant)
        for k, (name, first) in enumerate(list(self._first.items())):
            meter = first.meter
            if checks is not None:
                check = checks[k]
                if check.reservation_id is None:
                    meter.withdraw_ahead()
                    del self._first[name]
                    continue
                assert isinstance(cap, TenantDailyCap)
                meter.hold_daily(cap.held(check.reservation_id, check.day, meter.worst))
            meter.sub.attempts += 1

    def prepare(self, synth: Subtask) -> None:
        """The last worker's answer is in, its result about to be queued for its commit: build
        the synthesizer's call on the answers and queue its first attempt's row now, so that it
        commits with the last results (one commit on the swarm's critical path, not two) — or,
        when a shared cap must be asked first, write it ahead while they commit. The call is
        still sent only from `SubtaskExecutor.run`, once every worker's result is durable, and
        only if what they stored is what it was built on. (No `ahead_slots` permit: no call is
        waiting for its slots any more.)"""
        if (self._prepared is not None or synth.tools
                or not self.owned.ctx.settings.latency_devices):
            return
        results = self.owned.worker_results()
        inputs = [Input.of(r) for r in results]
        try:
            if not results or not self.inputs.uncompressed(synth, inputs):
                return  # compressors: at its turn
            messages = self.inputs.messages(synth, inputs)
            prepared = Prepared(results, messages, self.steps.meter(synth, messages, 1))
        except ValueError:
            # the answers are not stored yet: one the database will refuse may hold text
            # that does not even encode (the gateway client cleans it, unless switched off);
            # the synthesizer then waits for its turn, and this worker's result is unharmed
            return
        written = prepared.meter.prepare_now()
        self._prepared = asyncio.create_task(
            self._prepare(prepared) if written is None else self._durable(prepared, written))

    @staticmethod
    async def _durable(prepared: Prepared, written: asyncio.Future[None]) -> Prepared | None:
        try:
            await written
        except BaseException as exc:
            await prepared.meter.release()  # cancelled: never sent
            if isinstance(exc, WriteRejected):
                return None  # its turn writes it again, alone
            raise
        return prepared

    @staticmethod
    async def _prepare(prepared: Prepared) -> Prepared | None:
        """A shared cap to reserve against (every tenant's daily one by default) or a budget
        to wait for: the row is written ahead as any call's, while the results commit."""
        try:
            await prepared.meter.prepare()  # cleans up after itself when it fails
        except CALL_FAILURES:  # the budget, say: its turn meets the same refusal
            return None
        return prepared

    async def take_prepared(self) -> Prepared | None:
        """The prepared call, if it is still the one to make: a result it was built on may
        have been refused by the database since (that worker failed), and its attempt is then
        cancelled, never sent."""
        task, self._prepared = self._prepared, None
        assert task is not None
        prepared = await task
        if prepared is None or prepared.results == self.owned.worker_results():
            return prepared
        await prepared.meter.release()
        return None

    async def discard(self) -> None:
        """The synthesizer is not called (the swarm stops): a prepared attempt is cancelled,
        as is a first attempt written with the creation whose worker was never started."""
        first, self._first = self._first, {}
        for call in first.values():
            await call.meter.release()
        task, self._prepared = self._prepared, None
        if task is None:
            return
        task.cancel()  # one still writing ahead cleans up after itself
        done = await asyncio.gather(task, return_exceptions=True)
        if isinstance(done[0], Prepared):
            await done[0].meter.release()
