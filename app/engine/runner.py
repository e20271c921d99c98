"""Drives one swarm while this process holds its lease: planning, workers, synthesis, the end."""

from __future__ import annotations

import asyncio
import graphlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import logs, metrics, tracing
from app.db import spend
from app.db.base import column_values
from app.db.changes import SUBTASK_STATE_COLUMNS, SWARM_STATE_COLUMNS, SwarmWrite
from app.db.create import Ahead, insert_row
from app.db.leases import LeaseLost, record_takeover
from app.db.live_rows import live_subtask, live_swarm
from app.db.tables import Subtask, Swarm
from app.db.types import utcnow
from app.engine import approval, dag, gate
from app.engine.budget import SwarmBudget
from app.engine.calls import CANCELLED, IN_FLIGHT, UNKNOWN
from app.engine.execute import SubtaskExecutor
from app.engine.faults import crash_point
from app.engine.finish import end_swarm, event_row, log_end
from app.engine.handle import (
    EngineContext,
    EventRow,
    LedgerRow,
    Outcome,
    ToolRows,
    WebhookRow,
    failure,
    failure_causes,
)
from app.engine.layout import PLANNER, synthesizer
from app.engine.steps import refused_result, unstorable
from app.engine.synthesis import WorkerResult, concatenate, tally
from app.engine.writer import WriteRejected, retrieve_exception
from app.pricing import metric_model_label
from app.states import Event, SubtaskKind, SubtaskStatus, SwarmStatus, move_subtask, move_swarm

log = logging.getLogger(__name__)
# ledger outcomes that are no answer: a swarm whose calls end only so made no progress
_UNSETTLED = frozenset({IN_FLIGHT, UNKNOWN, CANCELLED})


class Drained(Exception):
    """The runner stopped for a shutdown with the swarm unfinished."""


class Parked(Exception):
    """The runner stopped with the swarm held for approval (its lease given up)."""


class SwarmRunner:
    """One swarm: in-memory state is the authority while the lease is held; every change is
    written through the group-committing StateWriter, fenced by the lease epoch."""

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
        self.add_subtasks(subtasks)
        if self.swarm.unresolved_usd is None:  # a row built in memory without every default
            self.swarm.unresolved_usd = Decimal(0)
        # reservations die with the process that made them; spent is what the ledger settled
        # (a dead owner's attempts in flight included, at their reservations: see _start)
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
        self.finished = False
        self._stop_status: SwarmStatus | None = None
        self._stop_error: dict[str, Any] | None = None
        # the swarm's last result (synthesizer's or last worker's), written with its end
        self._with_end: tuple[list[Subtask], list[LedgerRow], list[EventRow]] = ([], [], [])
        # subtasks started since the last write, and their events (`started`)
        self._starting: tuple[list[Subtask], list[EventRow]] = ([], [])
        # during the workers' phase: the workers yet to answer (None outside it), and what to
        # do once none is left (`answered`) when a synthesizer follows
        self._unanswered: int | None = None
        self._on_all_answered: Callable[[], None] | None = None
        self._early: SubtaskExecutor | None = None  # first_wave's, until the run takes it
        self._ahead: Ahead | None = None  # ... and the calls it had the creation write
        # until when (monotonic) the lease the creation took surely holds: half of it
        self._fresh_until = 0.0

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

    def add_subtasks(self, subs: Sequence[Subtask]) -> None:
        for s in map(live_subtask, subs):
            self.subs[s.name] = s
            self.deps[s.name] = list(s.depends_on)

    def forget_subtasks(self, subs: Sequence[Subtask]) -> None:
        """Drop subtasks whose insert was refused (they never existed)."""
        for s in subs:
            self.subs.pop(s.name, None)
            self.deps.pop(s.name, None)

    # ---- control ------------------------------------------------------------------------

    def request_cancel(self) -> None:
        self.stop_with(SwarmStatus.cancelled, None)

    def drain(self) -> None:
        """Shutdown: launch nothing new; end once the calls in flight are committed, leaving
        the swarm unfinished for the next owner."""
        self._drain.set()

    def deadline_error(self) -> dict[str, Any]:
        return failure("deadline_exceeded", f"deadline of {self.limits['deadline_s']} s passed")

    def answered(self, sub: Subtask) -> None:
        """A subtask's final state is about to be queued for its commit (not yet durable)."""
        if sub.kind is SubtaskKind.worker:
            self._one_less_unanswered()

    def _one_less_unanswered(self) -> None:
        if self._unanswered is None:
            return
        self._unanswered -= 1
        if self._unanswered <= 0 and not self._stop.is_set() and self._on_all_answered:
            then, self._on_all_answered = self._on_all_answered, None
            then()

    def last_answer(self, sub: Subtask) -> bool:
        """Whether this worker's success (already `answered`) is the swarm's last result
        before its end: every other worker has answered, no synthesizer follows, and the
        swarm is neither stopping nor draining. It is then written with the end."""
        return (sub.kind is SubtaskKind.worker and self._unanswered == 0
                and not self._stop.is_set() and not self._drain.is_set()
                and self._synthesizer() is None)

    def stop_with(self, status: SwarmStatus, err: dict[str, Any] | None) -> None:
        if not self._stop.is_set():
            self._stop_status, self._stop_error = status, err
            self._stop.set()

    # ---- state writes -------------------------------------------------------------------

    def event(self, event: Event) -> EventRow:
        return event_row(self.swarm, event, utcnow())

    def _write(self, subs: Sequence[Subtask], ledger: Sequence[LedgerRow],
               events: Sequence[EventRow], new: Sequence[Subtask],
               webhook: WebhookRow | None = None, tools: ToolRows | None = None,
               linger: bool = False, meanwhile: Callable[[], None] | None = None
               ) -> asyncio.Future[None]:
        if self._starting[0]:  # they come first: their events' numbers are lower
            (starting, begun), self._starting = self._starting, ([], [])
            subs = [*(sub for sub in starting if sub not in subs), *subs]
            events = [*begun, *events]
        s = self.swarm
        s.spent_usd, s.reserved_usd = self.budget.spent, self.budget.reserved
        if any(row["outcome"] not in _UNSETTLED for row in ledger):
            s.settled_epoch = self.epoch  # progress: the next takeover is not fruitless
        return self.ctx.writer.submit(SwarmWrite(
            s.id, self.epoch, column_values(s, SWARM_STATE_COLUMNS),
            [{"name_": sub.name, "position_": sub.position,
              **column_values(sub, SUBTASK_STATE_COLUMNS)} for sub in subs],
            list(ledger), list(events), [insert_row(n) for n in new], webhook,
            *(tools or ([], []))), linger=linger, meanwhile=meanwhile)

    async def commit(self, subs: Sequence[Subtask] = (), ledger: Sequence[LedgerRow] = (),
                     events: Sequence[EventRow] = (), new: Sequence[Subtask] = (),
                     webhook: WebhookRow | None = None, tools: ToolRows | None = None,
                     meanwhile: Callable[[], None] | None = None) -> None:
        """Write and wait until durable (raises LeaseLost when fenced out); `meanwhile`: CPU
        work done while its statement runs (`StateWriter.submit`)."""
        await self._write(subs, ledger, events, new, webhook, tools, meanwhile=meanwhile)

    def submit(self, ledger: Sequence[LedgerRow]) -> asyncio.Future[None]:
        """Queue ledger rows now; the future resolves once they are durable."""
        return self._write((), ledger, (), ())

    def commit_soon(self, subs: Sequence[Subtask] = (), ledger: Sequence[LedgerRow] = (),
                    events: Sequence[EventRow] = (), tools: ToolRows | None = None) -> None:
        """Queue a write nobody waits for (a later awaited write of this swarm commits after it);
        without money in it, it may wait for the next awaited write (writer.LINGER_S)."""
        self._write(subs, ledger, events, (), tools=tools, linger=not ledger and not tools
                    ).add_done_callback(retrieve_exception)

    def started(self, sub: Subtask, event: EventRow) -> None:
        """A subtask's start (its event numbered), written with this swarm's next write: at
        the latest one loop turn later (`commit_soon`). The tasks of a wave all run in that
        turn, so their starts make one write after their sends, not a write each before
        them (~50 us of the CPU before each of a 100-agent fan-out's sends)."""
        subs, events = self._starting
        if not subs:
            asyncio.get_running_loop().call_soon(self._write_starts)
        subs.append(sub)
        events.append(event)

    def _write_starts(self) -> None:
        if self._starting[0]:  # not taken by a write meanwhile
            self.commit_soon()

    def write_with_end(self, subs: Sequence[Subtask], ledger: Sequence[LedgerRow],
                       events: Sequence[EventRow]) -> None:
        """Hold a write for the swarm's end commit: its last result (the synthesizer's, or
        the last worker's without one), after which nothing else of the swarm is written
        (its events' numbers come before the end's) and the end follows at once. A drain
        writes it alone."""
        held = self._with_end
        held[0].extend(subs)
        held[1].extend(ledger)
        held[2].extend(events)

    def _take_held(self) -> tuple[list[Subtask], list[LedgerRow], list[EventRow]]:
        held, self._with_end = self._with_end, ([], [], [])
        return held

    async def _write_held(self) -> None:
        subs, ledger, events = self._take_held()
        if subs or ledger or events:
            try:
                await self.commit(subs, ledger, events)
            except WriteRejected:  # its money is stored; the next owner runs it again
                log.warning("swarm %s: a result held for the end was refused", self.swarm.id)

    def _set_status(self, new: SwarmStatus) -> EventRow:
        return self.event(move_swarm(self.swarm, new, utcnow()))

    # ---- the run ------------------------------------------------------------------------

    async def run(self) -> None:
        s = self.swarm  # this task's lines name the swarm (its subtasks' tasks inherit it)
        logs.bind(swarm_id=s.id, tenant=s.tenant, traceparent=s.trace_parent)
        self._log_claim()
        metrics.runs_in_progress.inc()
        try:
            with tracing.swarm_span(self.swarm.id, self.swarm.trace_parent):
                await self._run()
        except Drained:
            await self._write_held()
            log.info("swarm %s: drained for shutdown", self.swarm.id)
        except Parked:
            log.info("swarm %s: awaiting approval", self.swarm.id)
        finally:
            metrics.runs_in_progress.dec()

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
            takeovers = await self._settle_lost()
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
        # freed only by the collector's rare full passes (a 1,000-agent swarm's ~2 MB stayed
        # for up to ~20 swarms, bench/RESULTS.md session 15); the one `first_wave` made is
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

    async def _settle_lost(self) -> list[dict[str, Any]]:
        """A takeover: the dead owner's attempts in flight become `unknown`, billed at their
        reservations, and the takeover is recorded when fruitless (one transaction, lease
        checked); this runner's totals follow. The fruitless takeovers counted so far."""
        s = self.swarm

        async def settle(session: AsyncSession) -> tuple[spend.Takeover, list[dict[str, Any]]
                                                         ] | None:
            took = await spend.settle_lost_attempts(
                session, s.id, self.epoch, self.ctx.owner, self.ctx.settings.lease_seconds)
            if took is None:
                return None
            return took, await record_takeover(
                session, s.id, self.epoch, [a.subtask_name for a in took.lost])

        settled = await self.ctx.writer.transact(settle)
        if settled is None:
            raise LeaseLost(s.id)
        took, takeovers = settled
        for a in took.lost:
            s.spent_usd += a.cost_usd
            s.unresolved_usd += a.cost_usd
            s.prompt_tokens += a.prompt_tokens
            s.completion_tokens += a.completion_tokens
            s.gateway_calls += 1
            self.budget.record(a.cost_usd)
            sub = self.subs.get(a.subtask_name)
            if sub is not None:
                sub.cost_usd += a.cost_usd
                sub.prompt_tokens += a.prompt_tokens
                sub.completion_tokens += a.completion_tokens
            metrics.count_unknown(metric_model_label(a.model, self.ctx.prices),
                                  float(a.cost_usd), a.prompt_tokens, a.completion_tokens)
        for name, n in took.attempts.items():
            if name in self.subs:
                self.subs[name].attempts = max(self.subs[name].attempts, n)
        if took.lost:
            log.warning("swarm %s: %d attempts of a dead owner settled as unknown (%s USD)",
                        s.id, len(took.lost), sum((a.cost_usd for a in took.lost), Decimal(0)))
        return takeovers

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
            await self.commit(back, events=events)
            return
        # not awaited: every later write of this swarm commits after it, and a crash before it
        # leaves the swarm claimable as it was
        self.commit_soon(back, events=events)

    async def _plan(self, executor: SubtaskExecutor) -> None:
        planner = self.subs.get(PLANNER)
        if planner is None:
            return
        if planner.status != SubtaskStatus.succeeded:
            await self._run_phase(executor, [PLANNER])
        if planner.status == SubtaskStatus.succeeded:
            if self.swarm.status == SwarmStatus.planning and not self._approval_pending():
                self.commit_soon(events=[self._set_status(SwarmStatus.running)])
        elif not self._stop.is_set():
            self.stop_with(SwarmStatus.failed, planner.error)

    def _approval_pending(self) -> bool:
        """The limits name an approval rule and nobody has decided on this plan yet."""
        return approval.asks(self.limits) and self.swarm.approval is None

    async def _hold(self, executor: SubtaskExecutor) -> None:
        """The approval gate, once the plan is known (SPEC §14): a plan that needs approval
        parks the swarm (Parked: its lease given up, nothing more called), else it runs."""
        if not self._approval_pending():
            return
        subs = list(self.subs.values())
        estimate = approval.worst_case(subs, self.swarm.task, self.ctx.prices)
        if approval.needed(self.limits, estimate):
            await self.commit()  # what came before is durable before the lease goes
            if self._stop.is_set():  # cancelled meanwhile: it ends, never held
                return
            if await gate.park(self.ctx.writer, self.swarm, subs, estimate, self.ctx.owner,
                               self.epoch):
                raise Parked
            raise LeaseLost(self.swarm.id)
        self.swarm.approval = {"state": "auto", "estimate": estimate}
        metrics.approvals.labels("auto").inc()
        if self.swarm.status in (SwarmStatus.queued, SwarmStatus.planning):
            self.commit_soon(events=[self._set_status(SwarmStatus.running)])

    async def _run_workers(self, executor: SubtaskExecutor) -> None:
        for name in self.worker_names():
            if self.subs[name].status in (SubtaskStatus.failed, SubtaskStatus.skipped):
                self._skip_dependents(name)
        self._unanswered = sum(self.subs[n].status == SubtaskStatus.pending
                               for n in self.worker_names())
        synth = self._synthesizer()
        if synth is not None and synth.status == SubtaskStatus.pending:
            # once every worker has answered, the synthesizer's call is prepared on those
            # answers while they are committed (SubtaskExecutor.prepare): its first attempt's
            # write-ahead goes in the same commit as the last results, not in one after it
            self._on_all_answered = lambda: executor.prepare(synth)
        try:
            await self._run_phase(executor, self.worker_names())
        finally:
            self._unanswered = None
            self._on_all_answered = None  # the executor is the run's (see _run)

    async def _synthesize(self, executor: SubtaskExecutor) -> None:
        results = self.worker_results()
        synth = self._synthesizer()  # `synthesize`, or a vote without a majority
        if synth is None and self.spec["synthesis"]["strategy"] == "vote":
            synth = await self._vote(results)
        if synth is not None:
            if not results:
                self._skip([synth.name], "no worker succeeded")
                return
            if synth.status != SubtaskStatus.succeeded:
                if self.swarm.status != SwarmStatus.synthesizing:  # not after a takeover
                    self.commit_soon(events=[self._set_status(SwarmStatus.synthesizing)])
                await self._run_phase(executor, [synth.name])
            if synth.status == SubtaskStatus.succeeded:
                self.swarm.result = synth.output
            elif not self._stop.is_set():
                self.stop_with(SwarmStatus.failed, synth.error)
        else:
            self.swarm.result = self._combined(results)

    def _combined(self, results: list[WorkerResult]) -> str | None:
        """The swarm's result without a synthesizer: its workers' results combined (a vote's
        winner is the result `_vote` set)."""
        strategy = self.spec["synthesis"]["strategy"]
        if strategy == "concatenate":
            return concatenate(results)
        return self.swarm.result if strategy == "vote" else None

    async def _vote(self, results: list[WorkerResult]) -> Subtask | None:
        """Count the workers' answers (the swarm's `vote`): the winner's is the result; when
        no two agree, a synthesizer merges them instead, added now and returned (SPEC §3)."""
        counted = tally(results)
        if counted is None:
            return None
        self.swarm.vote = counted.block()
        if counted.outcome != "no_majority":
            self.swarm.result = counted.answer
            return None
        copied = self._synthesizer()  # a retry's copy of the one an earlier run added
        if copied is not None:
            await self.commit()  # the count, before the synthesis it decided
            return copied
        position = max(s.position for s in self.subs.values()) + 1
        synth = synthesizer(self.swarm.id, self.spec, position, [r.name for r in results])
        self.add_subtasks([synth])
        added = self.subs[synth.name]
        await self.commit(new=[added])  # its row (and the count), before its start is written
        return added

    def _synthesizer(self) -> Subtask | None:
        """The swarm's synthesizer: laid out with a `synthesize` strategy; with `vote`, once
        the count found no majority (stored with it: a takeover finds both)."""
        strategy = self.spec["synthesis"]["strategy"]
        if strategy == "vote" and (self.swarm.vote or {}).get("outcome") != "no_majority":
            return None
        if strategy not in ("synthesize", "vote"):
            return None
        return next((s for s in self.subs.values() if s.kind == SubtaskKind.synthesizer), None)

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

    async def _finish(self, status: SwarmStatus, err: dict[str, Any] | None) -> None:
        now = utcnow()
        end = end_swarm(self.swarm, self.subs.values(), status, err, now)
        held, held_ledger, held_events = self._take_held()  # the last result
        changed, events = [*held, *end.changed], [*held_events, *end.events]
        notifier = self.ctx.notifier
        answer: list[bytes] = []

        def render() -> None:  # a waiting reader's answer, built while the end commits
            if notifier is not None and (
                    view := notifier.render(self.swarm.id, self.swarm, self.subs.values())):
                answer.append(view)

        try:
            await self.commit(changed, held_ledger, events, webhook=end.webhook,
                              meanwhile=render)
        except WriteRejected as exc:  # the result, say: end failed without it, not in a loop
            answer.clear()  # it showed the end refused
            status, err = self._refused_end(status, held, held_events, exc)
            completed = end.events[-1]
            completed["data"] = {**completed["data"], "status": status.value, "error": err}
            await self.commit(changed, held_ledger, events, webhook=end.webhook,
                              meanwhile=render)
        for sub in held:
            crash_point("after_commit", sub.name)
        self.finished = True
        if notifier is not None:  # committed: what a waiting reader may answer with
            notifier.ended(self.swarm.id, self.swarm, list(self.subs.values()),
                           answer[0] if answer else None)
        started = self.swarm.started_at or self.swarm.created_at
        duration = (now - started).total_seconds()
        metrics.runs_total.labels(status.value).inc()
        metrics.run_duration.labels(status.value).observe(duration)
        metrics.run_cost.labels(status.value).observe(float(self.budget.spent))
        log_end(self.swarm, status, duration, err)

    def _refused_end(self, status: SwarmStatus, held: list[Subtask], held_events: list[EventRow],
                     exc: WriteRejected) -> tuple[SwarmStatus, dict[str, Any] | None]:
        """The end's commit was refused (never stored): the swarm's end without what it held,
        as it would have been had that result been refused alone. A held result fails its
        subtask (`output_unstorable`): the synthesizer's fails the swarm; a last worker's
        fails the swarm only past the failure tolerance, its result combined without it."""
        err: dict[str, Any] | None
        if held:
            err = unstorable(exc)
            for sub, row in zip(held, held_events, strict=True):
                refused_result(sub, row, err)
        else:
            err = failure("internal", f"the final state was refused: {exc}")
        if held and held[0].kind is SubtaskKind.worker:
            if status is SwarmStatus.succeeded and self._past_tolerance():
                status, err = SwarmStatus.failed, self._stop_error
            else:
                err = self.swarm.error
            self.swarm.result = (self._combined(self.worker_results())
                                 if status is SwarmStatus.succeeded else None)
        else:
            status, self.swarm.result = SwarmStatus.failed, None
        self.swarm.status, self.swarm.error = status, err  # the first was never committed
        return status, err

    # ---- phases -------------------------------------------------------------------------

    async def _run_phase(self, executor: SubtaskExecutor, names: list[str]) -> None:
        """Start each subtask as soon as its dependencies succeeded and a slot is free."""
        in_phase = set(names)
        ts: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter(
            {n: [d for d in self.deps[n] if d in in_phase] for n in names})
        ts.prepare()
        ready: deque[str] = deque()
        running: dict[asyncio.Task[Outcome], str] = {}
        # every task puts itself here when done, once: a completion costs O(1), where
        # asyncio.wait over the running tasks added and removed a callback on each of them
        # per wake-up (O(in flight) per completion: 256 x 1,000 for a 1,000-agent swarm)
        finished: asyncio.Queue[asyncio.Future[Any]] = asyncio.Queue()
        stop_wait = asyncio.create_task(self._stop.wait())
        drain_wait = asyncio.create_task(self._drain.wait())
        stop_wait.add_done_callback(finished.put_nowait)
        drain_wait.add_done_callback(finished.put_nowait)
        # twice the slots: the subtasks in calls, and as many again whose answers are being
        # committed (a task per slot only kept each slot idle for a commit per subtask)
        tasks = 2 * int(self.limits["concurrency"])
        try:
            while True:
                self._collect_ready(ts, ready)
                self._launch(executor, ready, running, tasks, finished)
                if self._drain.is_set() and not running and not self._stop.is_set():
                    raise Drained
                if self._stop.is_set() or not running:
                    return
                timeout = self.deadline - time.monotonic()
                if timeout <= 0:
                    self.stop_with(SwarmStatus.failed, self.deadline_error())
                    return
                for task in await self._completed(finished, timeout):
                    name = running.pop(task, None)  # type: ignore[call-overload]
                    if name is None:  # stop_wait or drain_wait: the checks above act on it
                        continue
                    outcome = task.result()
                    if outcome is Outcome.succeeded:
                        ts.done(name)
                    elif outcome is Outcome.failed:
                        self._on_failure(name)
        finally:
            stop_wait.cancel()
            drain_wait.cancel()
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    @staticmethod
    async def _completed(finished: asyncio.Queue[asyncio.Future[Any]],
                         timeout: float) -> list[asyncio.Future[Any]]:
        """What finished since the last look: at least one, or nothing once `timeout` passed
        (the caller checks the deadline)."""
        try:
            async with asyncio.timeout(timeout):
                done = [await finished.get()]
        except TimeoutError:
            return []
        while not finished.empty():
            done.append(finished.get_nowait())
        return done

    def _launch(self, executor: SubtaskExecutor, ready: deque[str],
                running: dict[asyncio.Task[Outcome], str], tasks: int,
                finished: asyncio.Queue[asyncio.Future[Any]]) -> None:
        """Start ready subtasks, up to `tasks` at once, while the swarm is neither stopping nor
        draining (each then waits for the swarm's call slot, in launch order)."""
        while ready and len(running) < tasks and not (
            self._stop.is_set() or self._drain.is_set()
        ):
            name = ready.popleft()
            if self.subs[name].status == SubtaskStatus.pending:
                task = asyncio.create_task(executor.run(self.subs[name]))
                task.add_done_callback(finished.put_nowait)
                running[task] = name

    def _collect_ready(self, ts: graphlib.TopologicalSorter[str], ready: deque[str]) -> None:
        now = utcnow()
        while batch := sorted(ts.get_ready(), key=lambda n: self.subs[n].position):
            for name in batch:
                s = self.subs[name]
                if s.status == SubtaskStatus.succeeded:
                    ts.done(name)  # finished before a takeover: never called again
                elif s.status == SubtaskStatus.pending:
                    s.ready_at = s.ready_at or now
                    ready.append(name)

    def _on_failure(self, name: str) -> None:
        if self.subs[name].kind != SubtaskKind.worker:
            return
        if not self._past_tolerance():
            self._skip_dependents(name)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def failing(self, name: str, error: dict[str, Any]) -> None:
        """A worker's call failed for good, its slot still held: when its failure passes the
        tolerance the swarm stops now, so that a subtask waiting for that slot is not sent
        (`_on_failure`, after the failure's commit, came a turn too late)."""
        if self.subs[name].kind == SubtaskKind.worker:
            self._past_tolerance(failing=(name, error))

    def _past_tolerance(self, failing: tuple[str, dict[str, Any]] | None = None) -> bool:
        """Whether the failed workers (and `failing`, a name and its error) exceed the
        tolerance: then the swarm stops, failed `failure_tolerance_exceeded`, its details
        counting the subtasks' error codes so the cause is read on the swarm."""
        errors = {s.name: s.error for s in (self.subs[n] for n in self.worker_names())
                  if s.status == SubtaskStatus.failed}
        if failing is not None:
            errors[failing[0]] = failing[1]
        tolerance = float(self.limits["failure_tolerance"])
        if len(errors) / len(self.worker_names()) <= tolerance:
            return False
        self.stop_with(SwarmStatus.failed, failure(
            "failure_tolerance_exceeded",
            f"{len(errors)} of {len(self.worker_names())} subtasks failed "
            f"(tolerance {tolerance})", failed=list(errors), **failure_causes(errors)))
        return True

    def _skip_dependents(self, name: str) -> None:
        below = dag.descendants(self.deps, [name])
        self._skip([n for n in below if self.subs[n].kind == SubtaskKind.worker],
                   f"dependency {name} did not succeed")

    def _skip(self, names: list[str], reason: str) -> None:
        now = utcnow()
        changed: list[Subtask] = []
        events: list[EventRow] = []
        for n in sorted(names, key=lambda n: self.subs[n].position):
            s = self.subs[n]
            if s.status == SubtaskStatus.pending:
                skipped = move_subtask(s, SubtaskStatus.skipped, now, reason=reason)
                assert skipped is not None
                s.error = failure("skipped", reason)
                changed.append(s)
                events.append(self.event(skipped))
                if s.kind is SubtaskKind.worker:
                    self._one_less_unanswered()
        if changed:
            self.commit_soon(changed, events=events)
