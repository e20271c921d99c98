"""Drives one swarm while this process holds its lease: phases, slots, budget, state writes."""

from __future__ import annotations

import asyncio
import graphlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from app import metrics
from app.config import Settings
from app.db.queries import SUBTASK_STATE_COLUMNS, SWARM_STATE_COLUMNS, SwarmWrite
from app.db.tables import Subtask, Swarm
from app.db.types import utcnow
from app.engine import dag
from app.engine.budget import BudgetExceeded, Reservation, SwarmBudget
from app.engine.context import estimate_prompt_tokens, with_dependencies
from app.engine.synthesis import (
    SYNTHESIZER_SYSTEM,
    WorkerResult,
    concatenate,
    synthesis_prompt,
    vote,
)
from app.engine.writer import StateWriter, consume
from app.gateway.client import (
    AttemptRecord,
    ChatRequest,
    GatewayClient,
    GatewayRejected,
    GatewayUnavailable,
)
from app.gateway.pricing import PriceTable, metric_model_label
from app.states import SubtaskKind, SubtaskStatus, SwarmStatus, subtask_transition, swarm_transition

log = logging.getLogger(__name__)
Row = dict[str, Any]
CHARS_PER_TOKEN = 3  # for fitting context only; the budget uses the strict byte bound


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


def _error(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"code": code, "message": message, "details": details or None}


class SwarmRunner:
    """One swarm: in-memory state is the authority while the lease is held; every change is
    written through the group-committing StateWriter, fenced by the lease epoch."""

    def __init__(self, ctx: EngineContext, swarm: Swarm, subtasks: list[Subtask], epoch: int,
                 rescues: int = 0) -> None:
        self.ctx = ctx
        self.swarm = swarm
        self.subs = {s.name: s for s in subtasks}
        self.epoch = epoch
        self.rescues = rescues
        self.spec = swarm.spec
        self.limits: dict[str, Any] = swarm.spec["limits"]
        # reservations die with the process that made them; spent is what the ledger settled
        self.budget = SwarmBudget(limit=swarm.budget_usd, spent=swarm.spent_usd)
        self.deadline = time.monotonic() + float(self.limits["deadline_s"])
        self._stop = asyncio.Event()
        self._stop_status: SwarmStatus | None = None
        self._stop_error: dict[str, Any] | None = None
        self._deps = {s.name: list(s.depends_on) for s in subtasks}

    # ---- control ------------------------------------------------------------------------

    def request_cancel(self) -> None:
        self._stop_with(SwarmStatus.cancelled, None)

    def _deadline_error(self) -> dict[str, Any]:
        return _error("deadline_exceeded", f"deadline of {self.limits['deadline_s']} s passed")

    def _stop_with(self, status: SwarmStatus, error: dict[str, Any] | None) -> None:
        if not self._stop.is_set():
            self._stop_status, self._stop_error = status, error
            self._stop.set()

    # ---- state writes -------------------------------------------------------------------

    def _event(self, type_: str, data: dict[str, Any]) -> dict[str, Any]:
        self.swarm.event_seq += 1
        return {"swarm_id": self.swarm.id, "seq": self.swarm.event_seq, "type": type_,
                "data": data, "created_at": utcnow()}

    def _write(self, subs: Sequence[Subtask] = (), ledger: Sequence[Row] = (),
               events: Sequence[Row] = ()) -> asyncio.Future[None]:
        s = self.swarm
        s.spent_usd, s.reserved_usd = self.budget.spent, self.budget.reserved
        snapshot = {c: getattr(s, c) for c in SWARM_STATE_COLUMNS}
        rows = [{"id_": sub.id, **{c: getattr(sub, c) for c in SUBTASK_STATE_COLUMNS}}
                for sub in subs]
        return self.ctx.writer.submit(
            SwarmWrite(s.id, self.epoch, snapshot, rows, list(ledger), list(events)))

    async def _commit(self, subs: Sequence[Subtask] = (), ledger: Sequence[Row] = (),
                      events: Sequence[Row] = ()) -> None:
        await self._write(subs, ledger, events)

    def _commit_soon(self, subs: Sequence[Subtask] = (), ledger: Sequence[Row] = (),
                     events: Sequence[Row] = ()) -> None:
        """Queue a write nobody waits for (a later awaited write of this swarm commits after it)."""
        self._write(subs, ledger, events).add_done_callback(consume)

    def _set_status(self, new: SwarmStatus) -> dict[str, Any]:
        self.swarm.status = swarm_transition(SwarmStatus(self.swarm.status), new)
        return self._event("swarm.status", {"status": new.value})

    # ---- the run ------------------------------------------------------------------------

    async def run(self) -> None:
        metrics.runs_in_progress.inc()
        try:
            await self._run()
        finally:
            metrics.runs_in_progress.dec()

    async def _run(self) -> None:
        if self.rescues > self.ctx.settings.max_rescues:
            await self._finish(SwarmStatus.failed, _error(
                "internal", f"taken over {self.rescues} times: crash loop", rescues=self.rescues))
            return
        await self._start()
        await self._run_workers()
        if not self._stop.is_set():
            await self._synthesize()
        if self._stop.is_set():
            assert self._stop_status is not None
            await self._finish(self._stop_status, self._stop_error)
        else:
            await self._finish(SwarmStatus.succeeded, None)

    async def _start(self) -> None:
        now = utcnow()
        events: list[dict[str, Any]] = []
        if self.swarm.status == SwarmStatus.queued:
            self.swarm.started_at = now
            events.append(self._set_status(SwarmStatus.running))
        elif self.swarm.started_at is not None:
            elapsed = (now - self.swarm.started_at).total_seconds()
            self.deadline = time.monotonic() + float(self.limits["deadline_s"]) - elapsed
        # takeover: what was in flight in a dead process runs again (attempts are kept)
        back = [s for s in self.subs.values() if s.status == SubtaskStatus.running]
        for s in back:
            s.status = subtask_transition(SubtaskStatus(s.status), SubtaskStatus.pending)
        await self._commit(back, events=events)

    async def _run_workers(self) -> None:
        workers = [s.name for s in self.subs.values() if s.kind == SubtaskKind.worker]
        for s in list(self.subs.values()):
            if s.kind == SubtaskKind.worker and s.status in (SubtaskStatus.failed,
                                                             SubtaskStatus.skipped):
                self._skip_dependents(s.name)
        await self._run_phase(workers)

    async def _synthesize(self) -> None:
        results = self._worker_results()
        strategy = self.spec["synthesis"]["strategy"]
        synth = next((s for s in self.subs.values() if s.kind == SubtaskKind.synthesizer), None)
        if strategy == "synthesize" and synth is not None:
            if not results:
                self._skip([synth.name], "no worker succeeded")
                return
            if synth.status != SubtaskStatus.succeeded:
                self._commit_soon(events=[self._set_status(SwarmStatus.synthesizing)])
                await self._run_phase([synth.name])
            if synth.status == SubtaskStatus.succeeded:
                self.swarm.result = synth.output
            elif not self._stop.is_set():
                self._stop_with(SwarmStatus.failed, synth.error)
        elif strategy == "concatenate":
            self.swarm.result = concatenate(results)
        elif strategy == "vote":
            self.swarm.result = vote(results)

    def _worker_results(self) -> list[WorkerResult]:
        workers = {n: s for n, s in self.subs.items() if s.kind == SubtaskKind.worker}
        deps = {n: [d for d in self._deps[n] if d in workers] for n in workers}
        order = dag.topological_order(deps, sorted(workers, key=lambda n: workers[n].position))
        return [WorkerResult(n, workers[n].output or "", workers[n].weight, workers[n].truncated)
                for n in order if workers[n].status == SubtaskStatus.succeeded]

    async def _finish(self, status: SwarmStatus, error: dict[str, Any] | None) -> None:
        now = utcnow()
        stopped_by_user = status == SwarmStatus.cancelled or (
            error is not None and error.get("code") == "deadline_exceeded")
        changed: list[Subtask] = []
        events: list[dict[str, Any]] = []
        for s in self.subs.values():
            if s.status == SubtaskStatus.running or (
                stopped_by_user and s.status == SubtaskStatus.pending
            ):
                s.status = subtask_transition(SubtaskStatus(s.status), SubtaskStatus.cancelled)
                s.finished_at = now
                changed.append(s)
            elif s.status == SubtaskStatus.pending:
                s.status = subtask_transition(SubtaskStatus(s.status), SubtaskStatus.skipped)
                s.finished_at = now
                changed.append(s)
                events.append(self._event("subtask.skipped",
                                          {"name": s.name, "reason": "swarm stopped"}))
        self.swarm.status = swarm_transition(SwarmStatus(self.swarm.status), status)
        self.swarm.finished_at = now
        self.swarm.error = error
        if status != SwarmStatus.succeeded and self.spec["synthesis"]["strategy"] != "synthesize":
            self.swarm.result = None
        events.append(self._event("swarm.completed", {
            "status": status.value, "error": error,
            "cancelled": [s.name for s in changed if s.status == SubtaskStatus.cancelled],
        }))
        await self._commit(changed, events=events)
        started = self.swarm.started_at or self.swarm.created_at
        metrics.runs_total.labels(status.value).inc()
        metrics.run_duration.labels(status.value).observe((now - started).total_seconds())
        metrics.run_cost.labels(status.value).observe(float(self.budget.spent))

    # ---- phases -------------------------------------------------------------------------

    async def _run_phase(self, names: list[str]) -> None:
        """Start each subtask as soon as its dependencies succeeded and a slot is free."""
        in_phase = set(names)
        ts: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter(
            {n: [d for d in self._deps[n] if d in in_phase] for n in names})
        ts.prepare()
        ready: deque[str] = deque()
        running: dict[asyncio.Task[SubtaskStatus], str] = {}
        stop_wait = asyncio.create_task(self._stop.wait())
        concurrency = int(self.limits["concurrency"])
        try:
            while True:
                self._collect_ready(ts, ready)
                while ready and len(running) < concurrency and not self._stop.is_set():
                    name = ready.popleft()
                    if self.subs[name].status == SubtaskStatus.pending:
                        task = asyncio.create_task(self._run_subtask(self.subs[name]))
                        running[task] = name
                if self._stop.is_set() or not running:
                    return
                timeout = self.deadline - time.monotonic()
                if timeout <= 0:
                    self._stop_with(SwarmStatus.failed, self._deadline_error())
                    return
                waiting: list[asyncio.Future[Any]] = [*running, stop_wait]
                done, _ = await asyncio.wait(waiting, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in [t for t in running if t in done]:
                    name = running.pop(task)
                    outcome = task.result()
                    if outcome == SubtaskStatus.succeeded:
                        ts.done(name)
                    elif outcome == SubtaskStatus.failed:
                        self._on_failure(name)
        finally:
            stop_wait.cancel()
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

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
        sub = self.subs[name]
        if sub.kind != SubtaskKind.worker:
            return
        workers = [s for s in self.subs.values() if s.kind == SubtaskKind.worker]
        failed = sum(s.status == SubtaskStatus.failed for s in workers)
        tolerance = float(self.limits["failure_tolerance"])
        if failed / len(workers) > tolerance:
            self._stop_with(SwarmStatus.failed, _error(
                "failure_tolerance_exceeded",
                f"{failed} of {len(workers)} subtasks failed (tolerance {tolerance})",
                failed=[s.name for s in workers if s.status == SubtaskStatus.failed]))
        else:
            self._skip_dependents(name)

    def _skip_dependents(self, name: str) -> None:
        below = dag.descendants(self._deps, [name])
        self._skip([n for n in below if self.subs[n].kind == SubtaskKind.worker],
                   f"dependency {name} did not succeed")

    def _skip(self, names: list[str], reason: str) -> None:
        now = utcnow()
        changed: list[Subtask] = []
        events: list[dict[str, Any]] = []
        for n in sorted(names, key=lambda n: self.subs[n].position):
            s = self.subs[n]
            if s.status == SubtaskStatus.pending:
                s.status = subtask_transition(SubtaskStatus(s.status), SubtaskStatus.skipped)
                s.finished_at = now
                s.error = _error("skipped", reason)
                changed.append(s)
                events.append(self._event("subtask.skipped", {"name": n, "reason": reason}))
        if changed:
            self._commit_soon(changed, events=events)

    # ---- one subtask --------------------------------------------------------------------

    def _messages(self, sub: Subtask) -> list[dict[str, str]]:
        if sub.kind == SubtaskKind.synthesizer:
            results = self._worker_results()
            done = {r.name for r in results}
            missing = [s.name for s in self.subs.values()
                       if s.kind == SubtaskKind.worker and s.name not in done]
            user = synthesis_prompt(self.swarm.task, results, missing)
            system = sub.system_prompt or SYNTHESIZER_SYSTEM
        else:
            deps = [(d, self.subs[d].output or "") for d in self._deps[sub.name]]
            window = self.ctx.prices[sub.model].context_window
            room = (window - sub.max_tokens) * CHARS_PER_TOKEN - len(sub.system_prompt) - len(
                sub.prompt) - 2000
            user = with_dependencies(sub.prompt, deps, room)
            system = sub.system_prompt
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": user})
        return messages

    async def _run_subtask(self, sub: Subtask) -> SubtaskStatus:
        """Call the gateway for one subtask; returns its new status (never raises but for
        cancellation and a lost lease)."""
        async with AsyncExitStack() as stack:
            slot = self.ctx.model_slots.get(sub.model)
            if slot is not None:
                await stack.enter_async_context(slot)
            await stack.enter_async_context(self.ctx.inflight)
            return await self._call(sub)
        raise AssertionError("unreachable")

    async def _call(self, sub: Subtask) -> SubtaskStatus:
        price = self.ctx.prices[sub.model]
        label = metric_model_label(sub.model, self.ctx.prices)
        messages = self._messages(sub)
        worst = price.worst_case(estimate_prompt_tokens(messages), sub.max_tokens)
        started = utcnow()
        sub.status = subtask_transition(SubtaskStatus(sub.status), SubtaskStatus.running)
        sub.started_at, sub.finished_at, sub.error = started, None, None
        metrics.queue_wait.labels(sub.kind).observe(
            max((started - (sub.ready_at or started)).total_seconds(), 0.0))
        self._commit_soon([sub], events=[self._event(
            "subtask.started", {"name": sub.name, "kind": sub.kind, "model": sub.model})])
        held: list[Reservation] = []
        ok_rows: list[dict[str, Any]] = []
        last_outcome: list[str] = []

        async def before(attempt: int) -> None:
            if attempt > 1 and last_outcome:
                metrics.gateway_retries.labels(label, last_outcome[-1]).inc()
            held.append(await self.budget.reserve(worst))
            sub.attempts += 1

        async def after(rec: AttemptRecord) -> None:
            row = self._account(sub, rec, held.pop() if held else None, label)
            last_outcome.append(rec.outcome)
            if rec.outcome == "ok":
                ok_rows.append(row)
            else:
                self._commit_soon([sub], ledger=[row])

        t0 = time.monotonic()
        metrics.subtasks_in_flight.labels(label).inc()
        try:
            result = await self.ctx.gateway.complete(
                ChatRequest(model=sub.model, messages=messages, max_tokens=sub.max_tokens,
                            temperature=sub.temperature,
                            idempotency_key=f"{self.swarm.id}:{sub.name}:1"),
                max_attempts=int(self.limits["max_attempts"]),
                timeout_s=float(self.limits["subtask_timeout_s"]),
                deadline=self.deadline, before_attempt=before, after_attempt=after)
        except BudgetExceeded as exc:
            metrics.budget_denials.labels(exc.scope).inc()
            code = "budget_exceeded" if exc.scope == "swarm" else "daily_budget_exceeded"
            self._stop_with(SwarmStatus.failed, _error(code, str(exc)))
            sub.error = _error(code, str(exc))
            return SubtaskStatus.running  # the swarm stops; _finish cancels this subtask
        except GatewayRejected as exc:
            if exc.status_code in (401, 403):
                self._stop_with(SwarmStatus.failed, _error(
                    "gateway_rejected", str(exc), status=exc.status_code))
            return await self._fail(sub, t0, _error("gateway_rejected", str(exc),
                                                    status=exc.status_code))
        except GatewayUnavailable as exc:
            if exc.deadline_hit:
                # the swarm's deadline, seen first by the client: stop like the phase loop does
                self._stop_with(SwarmStatus.failed, self._deadline_error())
                return SubtaskStatus.running  # _finish cancels it
            return await self._fail(sub, t0, _error(
                "gateway_unavailable", str(exc), status=exc.status_code, outcome=exc.outcome))
        finally:
            metrics.subtasks_in_flight.labels(label).dec()
            for r in held:
                self.budget.settle(r, Decimal(0))
        metrics.finish_reasons.labels(label, metrics.finish_label(result.finish_reason)).inc()
        sub.status = subtask_transition(SubtaskStatus(sub.status), SubtaskStatus.succeeded)
        sub.output = result.content
        sub.truncated = result.finish_reason == "length"
        self._finished(sub, t0)
        await self._commit([sub], ok_rows, [self._event("subtask.succeeded", {
            "name": sub.name, "kind": sub.kind, "latency_ms": sub.latency_ms,
            "truncated": sub.truncated})])
        return SubtaskStatus.succeeded

    def _finished(self, sub: Subtask, t0: float) -> None:
        sub.finished_at = utcnow()
        sub.latency_ms = round((time.monotonic() - t0) * 1000, 1)
        metrics.subtask_duration.labels(
            sub.kind, metric_model_label(sub.model, self.ctx.prices), sub.status
        ).observe(sub.latency_ms / 1000)

    async def _fail(self, sub: Subtask, t0: float, error: dict[str, Any]) -> SubtaskStatus:
        sub.status = subtask_transition(SubtaskStatus(sub.status), SubtaskStatus.failed)
        sub.error = error
        self._finished(sub, t0)
        await self._commit([sub], events=[self._event(
            "subtask.failed", {"name": sub.name, "kind": sub.kind, "error": error})])
        return SubtaskStatus.failed

    def _account(self, sub: Subtask, rec: AttemptRecord, held: Reservation | None,
                 label: str) -> dict[str, Any]:
        """Bill one attempt: settle its reservation, add to subtask and swarm totals, and
        return its ledger row."""
        u = rec.usage
        cost = self.ctx.prices[sub.model].cost(u.prompt_tokens, u.completion_tokens,
                                               u.cached_tokens)
        if held is not None:
            self.budget.settle(held, cost)
        else:
            self.budget.record(cost)
        sub.prompt_tokens += u.prompt_tokens
        sub.completion_tokens += u.completion_tokens
        sub.cost_usd += cost
        self.swarm.prompt_tokens += u.prompt_tokens
        self.swarm.completion_tokens += u.completion_tokens
        self.swarm.gateway_calls += 1
        metrics.gateway_requests.labels(label, rec.outcome).inc()
        metrics.gateway_duration.labels(label, rec.outcome).observe(rec.latency_s)
        metrics.tokens_total.labels(label, "prompt").inc(u.prompt_tokens)
        metrics.tokens_total.labels(label, "completion").inc(u.completion_tokens)
        metrics.spend_total.labels(label).inc(float(cost))
        return {
            "swarm_id": self.swarm.id, "tenant": self.swarm.tenant, "subtask_name": sub.name,
            "model": sub.model, "idempotency_key": f"{self.swarm.id}:{sub.name}:1",
            "attempt": sub.attempts, "http_status": rec.status_code, "outcome": rec.outcome,
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "cached_tokens": u.cached_tokens, "cost_usd": cost,
            "latency_ms": round(rec.latency_s * 1000, 3), "created_at": utcnow(),
        }

