"""Drives one swarm while this process holds its lease: its lifecycle (claim, takeover, start,
the phases in turn, the end), composing the run's parts: its state (run_state, with journal
for its writes), its failure tolerance, its ends, its phase loop, and what its subtasks see of
it (owned_run); the takeover's settling is takeover's."""

from __future__ import annotations

import logging
import time
from typing import Any

from app import logs, metrics, tracing
from app.aio import run_to_end
from app.db.create import Ahead
from app.db.tables import Subtask, Swarm
from app.db.types import utcnow
from app.engine import approval
from app.engine.ends import SwarmEnds
from app.engine.execute import SubtaskExecutor
from app.engine.owned_run import OwnedRun
from app.engine.owned_swarm import EngineContext, EventRow, failure
from app.engine.phases import Drained, Parked, SwarmPhases
from app.engine.run_state import RunnerState
from app.engine.subtask_rows import PLANNER
from app.engine.takeover import settle_lost
from app.engine.tolerance import FailureTolerance
from app.states import SubtaskStatus, SwarmStatus, move_subtask

log = logging.getLogger(__name__)


class SwarmRunner:
    """One swarm, from its claim (or creation) to its end; its parts hold its state
    (RunnerState), and none of them holds the runner."""

    def __init__(self, ctx: EngineContext, swarm: Swarm, subtasks: list[Subtask], epoch: int,
                 rescues: int = 0) -> None:
        self.state = RunnerState(ctx, swarm, subtasks, epoch, rescues)
        self.tolerance = FailureTolerance(self.state)
        self.ends = SwarmEnds(self.state, self.tolerance)
        self.phases = SwarmPhases(self.state, self.tolerance)
        self.owned = OwnedRun(self.state, self.tolerance)
        self._early: SubtaskExecutor | None = None  # first_wave's, until the run takes it
        self._ahead: Ahead | None = None  # ... and the calls it had the creation write
        # until when (monotonic) the lease the creation took surely holds: half of it
        self._fresh_until = 0.0

    # ---- what the scheduler asks of it ----------------------------------------------------

    @property
    def swarm(self) -> Swarm:
        return self.state.swarm

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def finished(self) -> bool:
        """Its end is committed."""
        return self.ends.finished

    def request_cancel(self) -> None:
        self.state.request_cancel()

    def drain(self) -> None:
        """Shutdown: launch nothing new; end once the calls in flight are committed, leaving
        the swarm unfinished for the next owner."""
        self.state.drain()

    # ---- its lifecycle --------------------------------------------------------------------

    def first_wave(self) -> Ahead:
        """For a new swarm this process claims as it creates it, before the creation's
        statement: its first calls to write ahead in that statement
        (`SubtaskExecutor.first_wave`), their reservations in the swarm's `reserved_usd`."""
        self._early = SubtaskExecutor(self.owned)
        self._ahead = self._early.first_wave()
        self.swarm.reserved_usd = self.state.budget.reserved
        # the statement's lease runs from after now (the database's clock, its start)
        self._fresh_until = time.monotonic() + self.state.ctx.settings.lease_seconds / 2
        return self._ahead

    async def run(self) -> None:
        s = self.swarm  # this task's lines name the swarm (its subtasks' tasks inherit it)
        logs.bind(swarm_id=s.id, tenant=s.tenant, traceparent=s.trace_parent)
        self._log_claim()
        metrics.runs_in_progress.inc()
        try:
            with tracing.swarm_span(self.swarm.id, self.swarm.trace_parent):
                await self._run()
        except Drained:
            await self.state.journal.write_held()
            log.info("swarm %s: drained for shutdown", self.swarm.id)
        except Parked:
            log.info("swarm %s: awaiting approval", self.swarm.id)
        finally:
            metrics.runs_in_progress.dec()
            tenants = self.state.ctx.tenants
            if (left := self.state.journal.unwritten()) and tenants is not None:
                # their calls' rows were dropped with their results: no write carried them
                await run_to_end(tenants.settle_unwritten(left))

    @property
    def _taken_over(self) -> bool:
        # queued: nothing was ever sent, unless its creation wrote calls ahead (reserving
        # them) that its first owner may have sent before it died
        return self._early is None and (self.swarm.status != SwarmStatus.queued
                                        or bool(self.swarm.reserved_usd))

    def _log_claim(self) -> None:
        state = self.state
        s, at = self.swarm, {"epoch": state.epoch, "rescues": state.rescues,
                             "owner": state.ctx.owner}
        if self._early is not None:
            log.info("swarm %s claimed at its creation", s.id, extra=at)
        elif self._taken_over:
            log.info("swarm %s taken over (was %s)", s.id, s.status.value,
                     extra={**at, "status": s.status.value})
        else:
            log.info("swarm %s claimed", s.id, extra=at)

    async def _run(self) -> None:
        state, phases = self.state, self.phases
        takeovers: list[dict[str, Any]] = []
        if self._taken_over or state.rescues:
            takeovers = await settle_lost(state)
        if state.rescues >= state.ctx.settings.max_rescues:
            # the last SWARM_MAX_RESCUES takeovers were all fruitless: the swarm itself
            # (a poison prompt) takes its workers down, not churn from outside
            await self.ends.finish(SwarmStatus.failed, failure(
                "internal", f"taken over {state.rescues} times in a row with no call settled:"
                " crash loop", rescues=state.rescues, takeovers=takeovers))
            return
        await self._start()
        if self.swarm.cancel_requested:  # flagged before this process took the swarm
            state.request_cancel()
        # the executor refers to the run's parts (through `owned`) and a phase's callback to
        # it, so it is the run's, never the runner's: a reference back would make a cycle of
        # the whole swarm (its rows, outputs, events), freed only by the collector's rare full
        # passes (tests/perf/test_runner_freed.py); the one `first_wave` made is held only
        # until here (a new swarm's, which has no rescue to settle before)
        executor, self._early = self._early or SubtaskExecutor(self.owned), None
        executor.first_wave_opened(self._ahead)
        self._ahead = None
        try:
            for phase in (phases.plan, phases.hold, phases.run_workers, phases.synthesize):
                if state.stopping:
                    break
                await phase(executor)
        finally:  # before the end: nothing of the swarm is written after it
            await executor.discard_prepared()
        if state.stopping:
            assert state.stop_status is not None
            await self.ends.finish(state.stop_status, state.stop_error)
        else:
            await self.ends.finish(SwarmStatus.succeeded, None)

    async def _start(self) -> None:
        state, now = self.state, utcnow()
        events: list[EventRow] = []
        if self.swarm.status == SwarmStatus.queued:
            # a retry keeps the plan of the swarm it retries: its planner is already done
            planner = state.subs.get(PLANNER)
            planning = planner is not None and planner.status != SubtaskStatus.succeeded
            if planning or not self.phases.approval_pending():  # else `hold` decides first
                events.append(state.set_status(SwarmStatus.planning if planning
                                               else SwarmStatus.running))
        elif self.swarm.started_at is not None:
            since = approval.run_clock_start(self.swarm.approval, self.swarm.started_at)
            elapsed = (now - since).total_seconds()
            state.deadline = time.monotonic() + float(state.limits["deadline_s"]) - elapsed
        # takeover: what was in flight in a dead process runs again (attempts are kept)
        back = [s for s in state.subs.values() if s.status == SubtaskStatus.running]
        for s in back:
            move_subtask(s, SubtaskStatus.pending, now)
        if self._ahead is not None and self._ahead.rows and (
                time.monotonic() >= self._fresh_until):
            # its first calls were written with its creation, whose lease may have lapsed
            # since (this process stalled): they are sent only once a fenced write proves the
            # swarm still ours, as a write-ahead commit proves it for any other call
            await state.journal.commit(back, events=events)
            return
        # not awaited: every later write of this swarm commits after it, and a crash before it
        # leaves the swarm claimable as it was
        state.journal.commit_soon(back, events=events)
