"""Drives one swarm while this process holds its lease: its lifecycle (claim, takeover, start,
the phases in turn, the end). The parts it builds on: run_state (what they share), journal (its
writes), tolerance, ends, phases, takeover."""

from __future__ import annotations

import logging
import time
from typing import Any

from app import logs, metrics, tracing
from app.aio import run_to_end
from app.db.create import Ahead
from app.db.types import utcnow
from app.engine import approval
from app.engine.execute import SubtaskExecutor
from app.engine.handle import EventRow, failure
from app.engine.phases import Drained, Parked, SwarmPhases
from app.engine.subtask_rows import PLANNER
from app.engine.takeover import settle_lost
from app.states import SubtaskStatus, SwarmStatus, move_subtask

log = logging.getLogger(__name__)


class SwarmRunner(SwarmPhases):
    """One swarm, from its claim (or creation) to its end; see RunnerState for its state."""

    def first_wave(self) -> Ahead:
        """For a new swarm this process claims as it creates it, before the creation's
        statement: its first calls to write ahead in that statement
        (`SubtaskExecutor.first_wave`), their reservations in the swarm's `reserved_usd`."""
        self._early = SubtaskExecutor(self)
        self._ahead = self._early.first_wave()
        self.swarm.reserved_usd = self.budget.reserved
        # the statement's lease runs from after now (the database's clock, its start)
        self._fresh_until = time.monotonic() + self.ctx.settings.lease_seconds / 2
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
            await self.journal.write_held()
            log.info("swarm %s: drained for shutdown", self.swarm.id)
        except Parked:
            log.info("swarm %s: awaiting approval", self.swarm.id)
        finally:
            metrics.runs_in_progress.dec()
            if (left := self.journal.unwritten()) and self.ctx.tenants is not None:
                # their calls' rows were dropped with their results: no write carried them
                await run_to_end(self.ctx.tenants.settle_unwritten(left))

    @property
    def _taken_over(self) -> bool:
        # queued: nothing was ever sent, unless its creation wrote calls ahead (reserving
        # them) that its first owner may have sent before it died
        return self._early is None and (self.swarm.status != SwarmStatus.queued
                                        or bool(self.swarm.reserved_usd))

    def _log_claim(self) -> None:
        s, at = self.swarm, {"epoch": self.epoch, "rescues": self.rescues,
                             "owner": self.ctx.owner}
        if self._early is not None:
            log.info("swarm %s claimed at its creation", s.id, extra=at)
        elif self._taken_over:
            log.info("swarm %s taken over (was %s)", s.id, s.status.value,
                     extra={**at, "status": s.status.value})
        else:
            log.info("swarm %s claimed", s.id, extra=at)

    async def _run(self) -> None:
        takeovers: list[dict[str, Any]] = []
        if self._taken_over or self.rescues:
            takeovers = await settle_lost(self)
        if self.rescues >= self.ctx.settings.max_rescues:
            # the last SWARM_MAX_RESCUES takeovers were all fruitless: the swarm itself
            # (a poison prompt) takes its workers down, not churn from outside
            await self._finish(SwarmStatus.failed, failure(
                "internal", f"taken over {self.rescues} times in a row with no call settled:"
                " crash loop", rescues=self.rescues, takeovers=takeovers))
            return
        await self._start()
        if self.swarm.cancel_requested:  # flagged before this process took the swarm
            self.request_cancel()
        # the executor refers to this runner, so it is the run's, never the runner's: a
        # reference back would make a cycle of the whole swarm (its rows, outputs, events),
        # freed only by the collector's rare full passes (a 1,000-agent swarm's ~2 MB would
        # stay for up to ~20 swarms; tests/perf/test_runner_freed.py); the one `first_wave` made is
        # held only until here (a new swarm's, which has no rescue to settle before)
        executor, self._early = self._early or SubtaskExecutor(self), None
        executor.first_wave_opened(self._ahead)
        self._ahead = None
        try:
            for phase in (self._plan, self._hold, self._run_workers, self._synthesize):
                if self._stop.is_set():
                    break
                await phase(executor)
        finally:  # before the end: nothing of the swarm is written after it
            await executor.discard_prepared()
        if self._stop.is_set():
            assert self._stop_status is not None
            await self._finish(self._stop_status, self._stop_error)
        else:
            await self._finish(SwarmStatus.succeeded, None)

    async def _start(self) -> None:
        now = utcnow()
        events: list[EventRow] = []
        if self.swarm.status == SwarmStatus.queued:
            # a retry keeps the plan of the swarm it retries: its planner is already done
            planner = self.subs.get(PLANNER)
            planning = planner is not None and planner.status != SubtaskStatus.succeeded
            if planning or not self._approval_pending():  # else `_hold` decides first
                events.append(self._set_status(SwarmStatus.planning if planning
                                               else SwarmStatus.running))
        elif self.swarm.started_at is not None:
            since = approval.run_clock_start(self.swarm.approval, self.swarm.started_at)
            elapsed = (now - since).total_seconds()
            self.deadline = time.monotonic() + float(self.limits["deadline_s"]) - elapsed
        # takeover: what was in flight in a dead process runs again (attempts are kept)
        back = [s for s in self.subs.values() if s.status == SubtaskStatus.running]
        for s in back:
            move_subtask(s, SubtaskStatus.pending, now)
        if self._ahead is not None and self._ahead.rows and (
                time.monotonic() >= self._fresh_until):
            # its first calls were written with its creation, whose lease may have lapsed
            # since (this process stalled): they are sent only once a fenced write proves the
            # swarm still ours, as a write-ahead commit proves it for any other call
            await self.journal.commit(back, events=events)
            return
        # not awaited: every later write of this swarm commits after it, and a crash before it
        # leaves the swarm claimable as it was
        self.journal.commit_soon(back, events=events)
