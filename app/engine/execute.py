"""Running one subtask: slots, the gateway call, planning with one repair, input compression."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app import metrics, tracing
from app.db.tables import Subtask
from app.db.types import utcnow
from app.engine import planner as plans
from app.engine.budget import BudgetExceeded
from app.engine.calls import CallMeter, Row, idempotency_key
from app.engine.context import (
    approx_tokens,
    estimate_prompt_tokens,
    estimate_request_tokens,
    fair_shares,
    fit_chars,
    with_dependencies,
)
from app.engine.faults import crash_point
from app.engine.layout import COMPRESSOR_PREFIX, SYNTHESIZER, new_subtask
from app.engine.synthesis import SYNTHESIZER_SYSTEM, WorkerResult, synthesis_prompt
from app.engine.turns import TurnLoop
from app.engine.writer import WriteRejected
from app.gateway.client import ChatRequest, ChatResult, GatewayRejected, GatewayUnavailable
from app.pricing import metric_model_label
from app.states import SubtaskKind, SubtaskStatus, SwarmStatus, subtask_transition

if TYPE_CHECKING:
    from app.engine.runner import SwarmRunner

COMPRESSOR_SYSTEM = ("You compress the result of another agent. Keep every fact, number, name, "
                     "decision and open question; drop repetition and filler.")
CONTEXT_MARGIN_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Input:
    """One result fed to a subtask, possibly replaced by its compressor's output."""

    name: str
    text: str
    compressed: bool = False

    @property
    def label(self) -> str:
        return f"{self.name} (compressed)" if self.compressed else self.name


def error(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"code": code, "message": message, "details": details or None}


def unstorable(exc: WriteRejected) -> dict[str, Any]:
    return error("output_unstorable", "the database refused to store this subtask's result; "
                 "its spend is recorded", refused_by=str(exc))


class SubtaskExecutor:
    """Executes subtasks for one SwarmRunner; returns each subtask's new status."""

    def __init__(self, runner: SwarmRunner) -> None:
        self.r = runner
        self._compressions: dict[str, asyncio.Task[str | None]] = {}
        self.turns = TurnLoop(self)

    async def run(self, sub: Subtask) -> SubtaskStatus:
        """Never raises but for cancellation and a lost lease."""
        with tracing.agent_span(sub.name, sub.kind, sub.model, self.r.swarm.id):
            status = await self._run(sub)
            if sub.status == SubtaskStatus.failed and sub.error:
                tracing.record_error(str(sub.error.get("code")), sub.error.get("message"))
            return status

    async def _run(self, sub: Subtask) -> SubtaskStatus:
        if sub.kind == SubtaskKind.planner:
            async with self._slots(sub):
                return await self._plan(sub)
        inputs = await self._inputs(sub)  # compressors take their own slots
        if sub.tools:  # the turn loop takes a slot per turn, never while tools run
            return await self.turns.run(sub, self._messages(sub, inputs))
        async with self._slots(sub):
            return await self._call(sub, self._messages(sub, inputs))

    @asynccontextmanager
    async def _slots(self, sub: Subtask) -> AsyncIterator[None]:
        """A per-model slot (when the model table limits it) and a process-wide one."""
        slot = self.r.ctx.model_slots.get(sub.model)
        async with AsyncExitStack() as stack:
            if slot is not None:
                await stack.enter_async_context(slot)
            # the tenant's slot before the process's: a tenant at its limit holds none
            await stack.enter_async_context(self.r.ctx.tenant_slot(self.r.swarm.tenant))
            await stack.enter_async_context(self.r.ctx.inflight)
            yield

    # ---- the call ----------------------------------------------------------------------

    def _begin(self, sub: Subtask) -> float:
        started = utcnow()
        sub.status = subtask_transition(SubtaskStatus(sub.status), SubtaskStatus.running)
        sub.started_at, sub.finished_at, sub.error = started, None, None
        waited = max((started - (sub.ready_at or started)).total_seconds(), 0.0)
        metrics.queue_wait.labels(sub.kind).observe(waited)
        tracing.event("queue_wait", seconds=waited)
        self.r.commit_soon([sub], events=[self.r.event(
            "subtask.started", {"name": sub.name, "kind": sub.kind, "model": sub.model})])
        return time.monotonic()

    async def _gateway(self, sub: Subtask, messages: list[dict[str, Any]], call_no: int,
                       response_format: dict[str, str] | None = None,
                       tools: list[dict[str, Any]] | None = None) -> tuple[ChatResult, list[Row]]:
        """One logical call with retries; raises the client's errors or BudgetExceeded."""
        key = idempotency_key(self.r.swarm.id, sub.name, call_no)
        label = metric_model_label(sub.model, self.r.ctx.prices)
        bound = (estimate_prompt_tokens(messages) if tools is None
                 else estimate_request_tokens(messages, tools))
        worst = self.r.ctx.prices[sub.model].worst_case(bound, sub.max_tokens)
        meter = CallMeter(self.r, sub, worst, key, label, bound)
        metrics.subtasks_in_flight.labels(label).inc()
        try:
            result = await self.r.ctx.gateway.complete(
                ChatRequest(model=sub.model, messages=messages, max_tokens=sub.max_tokens,
                            temperature=sub.temperature, response_format=response_format,
                            idempotency_key=key, tools=tools),
                max_attempts=int(self.r.limits["max_attempts"]),
                timeout_s=float(self.r.limits["subtask_timeout_s"]),
                deadline=self.r.deadline, before_attempt=meter.before, after_attempt=meter.after)
        finally:
            metrics.subtasks_in_flight.labels(label).dec()
            await meter.release()
        metrics.finish_reasons.labels(label, metrics.finish_label(result.finish_reason)).inc()
        return result, meter.ok_rows

    async def _call(self, sub: Subtask, messages: list[dict[str, str]]) -> SubtaskStatus:
        t0 = self._begin(sub)
        crash_point("before_call", sub.name)
        try:
            result, rows = await self._gateway(sub, messages, 1)
        except (BudgetExceeded, GatewayRejected, GatewayUnavailable, WriteRejected) as exc:
            return await self._failed_call(sub, t0, exc)
        crash_point("after_response", sub.name)
        sub.truncated = result.finish_reason == "length"
        sub.sanitized = result.sanitized
        status = await self._succeed(sub, t0, result.content, rows)
        crash_point("after_commit", sub.name)
        return status

    async def _failed_call(self, sub: Subtask, t0: float, exc: Exception) -> SubtaskStatus:
        """Map a call's failure onto the subtask and, where it must, the swarm."""
        if isinstance(exc, BudgetExceeded):
            # SPEC §5's scopes are `swarm` and `daily`: a tenant's daily cap is a daily one
            metrics.budget_denials.labels("swarm" if exc.scope == "swarm" else "daily").inc()
            code = "budget_exceeded" if exc.scope == "swarm" else "daily_budget_exceeded"
            # a tenant's own cap says so (SPEC §8); the global one keeps its old shape
            scope = {"scope": "tenant"} if exc.scope == "tenant" else {}
            sub.error = error(code, str(exc), **scope)
            self.r.stop_with(SwarmStatus.failed, error(code, str(exc), **scope))
            return SubtaskStatus.running  # the swarm stops; finishing cancels this subtask
        if isinstance(exc, GatewayUnavailable) and exc.deadline_hit:
            self.r.stop_with(SwarmStatus.failed, self.r.deadline_error())
            return SubtaskStatus.running
        if isinstance(exc, WriteRejected):
            return await self._fail(sub, t0, unstorable(exc))
        if isinstance(exc, GatewayRejected):
            err = error("gateway_rejected", str(exc), status=exc.status_code)
            if exc.status_code in (401, 403):
                self.r.stop_with(SwarmStatus.failed, err)
        else:
            assert isinstance(exc, GatewayUnavailable)
            err = error("gateway_unavailable", str(exc), status=exc.status_code,
                        outcome=exc.outcome)
        return await self._fail(sub, t0, err)

    async def _succeed(self, sub: Subtask, t0: float, output: str, rows: list[Row],
                       new: list[Subtask] | None = None) -> SubtaskStatus:
        running = SubtaskStatus(sub.status)
        sub.status = subtask_transition(running, SubtaskStatus.succeeded)
        sub.output = output
        self._finished(sub, t0)
        try:
            await self.r.commit([sub], rows, [self.r.event("subtask.succeeded", {
                "name": sub.name, "kind": sub.kind, "latency_ms": sub.latency_ms,
                "truncated": sub.truncated, "sanitized": sub.sanitized})], new=new or [])
        except WriteRejected as exc:
            # nothing of that write is stored but its ledger rows: this subtask fails alone
            sub.status, sub.output = running, None
            self.r.forget_subtasks(new or [])
            return await self._fail(sub, t0, unstorable(exc))
        return SubtaskStatus.succeeded

    async def _fail(self, sub: Subtask, t0: float, err: dict[str, Any],
                    rows: list[Row] | None = None) -> SubtaskStatus:
        sub.status = subtask_transition(SubtaskStatus(sub.status), SubtaskStatus.failed)
        sub.error = err
        self._finished(sub, t0)
        await self.r.commit([sub], rows or [], [self.r.event(
            "subtask.failed", {"name": sub.name, "kind": sub.kind, "error": err})])
        return SubtaskStatus.failed

    def _finished(self, sub: Subtask, t0: float) -> None:
        sub.finished_at = utcnow()
        sub.latency_ms = round((time.monotonic() - t0) * 1000, 1)
        metrics.subtask_duration.labels(
            sub.kind, metric_model_label(sub.model, self.r.ctx.prices), sub.status
        ).observe(sub.latency_ms / 1000)

    # ---- planning ----------------------------------------------------------------------

    async def _plan(self, sub: Subtask) -> SubtaskStatus:
        """The orchestrator call; an invalid or truncated plan gets exactly one repair call."""
        spec = self.r.spec
        limits = spec["orchestrator"]
        offered = spec.get("tools") or []
        first = plans.planner_messages(self.r.swarm.task, limits["max_subtasks"],
                                       limits["max_depth"], self.r.ctx.prices.names(),
                                       sub.system_prompt or "", offered)
        t0 = self._begin(sub)
        rows: list[Row] = []
        try:
            result, ok = await self._gateway(sub, first, 1, plans.JSON_OBJECT)
            rows += ok
            try:
                plan = plans.parse_plan(result.content, result.finish_reason,
                                        limits["max_subtasks"], limits["max_depth"], offered)
            except plans.PlanInvalid as bad:
                self.r.commit_soon([sub], ledger=rows)  # the first call is billed either way
                rows = []
                repair = plans.repair_messages(first, result.content, bad)
                result, ok = await self._gateway(sub, repair, 2, plans.JSON_OBJECT)
                rows += ok
                plan = plans.parse_plan(result.content, result.finish_reason,
                                        limits["max_subtasks"], limits["max_depth"], offered)
        except plans.PlanInvalid as still:
            err = error("plan_invalid", f"the plan is invalid after one repair: {still}",
                        **still.details)
            return await self._fail(sub, t0, err, rows)
        except (BudgetExceeded, GatewayRejected, GatewayUnavailable, WriteRejected) as exc:
            if rows:
                self.r.commit_soon([sub], ledger=rows)
            return await self._failed_call(sub, t0, exc)
        sub.sanitized = result.sanitized
        new = self._lay_out(plan)
        output = json.dumps({"subtasks": [
            {"id": p.id, "description": p.description, "depends_on": list(p.depends_on),
             "model_hint": p.model_hint, "tools": list(p.tools)} for p in plan]})
        return await self._succeed(sub, t0, output, rows, new)

    def _lay_out(self, plan: list[plans.PlannedSubtask]) -> list[Subtask]:
        """Worker subtasks for the plan (hinted models only when priced) and the synthesizer."""
        spec, swarm_id = self.r.spec, self.r.swarm.id
        base = len(self.r.subs)
        prices = self.r.ctx.prices
        subs = [
            new_subtask(swarm_id, p.id, base + i, SubtaskKind.worker,
                        p.model_hint if p.model_hint and p.model_hint in prices
                        else str(spec["model"]),
                        spec["max_tokens"], depends_on=list(p.depends_on),
                        system_prompt=None,  # worker_system_prompt(task), when called
                        prompt=p.description, temperature=spec.get("temperature"),
                        tools=list(p.tools))
            for i, p in enumerate(plan)
        ]
        if spec["synthesis"]["strategy"] == "synthesize":
            subs.append(new_subtask(
                swarm_id, SYNTHESIZER, base + len(plan), SubtaskKind.synthesizer,
                spec["synthesis"]["model"], spec["synthesis"]["max_tokens"],
                depends_on=[p.id for p in plan], temperature=spec.get("temperature")))
        self.r.add_subtasks(subs)
        return subs

    # ---- inputs and compression --------------------------------------------------------

    def _messages(self, sub: Subtask, inputs: list[Input]) -> list[dict[str, str]]:
        room = fit_chars(self._room_tokens(sub))
        if sub.kind == SubtaskKind.synthesizer:
            results = {r.name: r for r in self.r.worker_results()}
            fitted = [WorkerResult(i.label, i.text, results[i.name].weight,
                                   results[i.name].truncated) for i in inputs]
            missing = [n for n in self.r.worker_names() if n not in results]
            user = synthesis_prompt(self.r.swarm.task, fitted, missing, room)
            system = sub.system_prompt or SYNTHESIZER_SYSTEM
        else:
            user = with_dependencies(self._prompt(sub), [(i.label, i.text) for i in inputs],
                                     room)
            system = self._system(sub)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": user})
        return messages

    def _prompt(self, sub: Subtask) -> str:
        """The subtask's own prompt, or the task (stored once, on the swarm)."""
        return self.r.swarm.task if sub.prompt is None else sub.prompt

    def _system(self, sub: Subtask) -> str:
        """The subtask's system prompt; a planned worker's (None) is built from the task."""
        if sub.system_prompt is not None:
            return sub.system_prompt
        if sub.kind == SubtaskKind.worker:
            return plans.worker_system_prompt(self.r.swarm.task)
        return ""

    def _room_tokens(self, sub: Subtask) -> int:
        window = self.r.ctx.prices[sub.model].context_window
        frame = approx_tokens(self._system(sub)) + approx_tokens(self._prompt(sub))
        return max(window - sub.max_tokens - frame - CONTEXT_MARGIN_TOKENS, 0)

    async def _inputs(self, sub: Subtask) -> list[Input]:
        """Dependency outputs (or, for the synthesizer, every result) fitted to the window:
        oversized ones compressed by a compressor subtask unless `compress` is `never`."""
        if sub.kind == SubtaskKind.synthesizer:
            given = [Input(r.name, r.output) for r in self.r.worker_results()]
        elif sub.kind == SubtaskKind.worker:
            given = [Input(d, self.r.subs[d].output or "") for d in self.r.deps[sub.name]]
        else:
            return []
        mode = self.r.spec["synthesis"].get("compress", "auto")
        sizes = [approx_tokens(i.text) for i in given]
        room = self._room_tokens(sub)
        if not given or mode == "never" or (mode == "auto" and sum(sizes) <= room):
            return given
        shares = fair_shares(sizes, room)
        targets = [k for k in range(len(given)) if mode == "always" or sizes[k] > shares[k]]
        outputs = await asyncio.gather(*(
            self._compressed(given[k].name, given[k].text, max(min(shares[k], sizes[k]), 16))
            for k in targets))
        for k, out in zip(targets, outputs, strict=True):
            if out is not None:
                given[k] = Input(given[k].name, out, compressed=True)
        return given

    def _compressed(self, name: str, text: str, target: int) -> asyncio.Task[str | None]:
        """One compressor per input, shared by every dependent that needs it."""
        task = self._compressions.get(name)
        if task is None:
            task = asyncio.ensure_future(self._compress(name, text, target))
            self._compressions[name] = task
        return task

    async def _compress(self, name: str, text: str, target: int) -> str | None:
        cname = f"{COMPRESSOR_PREFIX}{name}"
        sub = self.r.subs.get(cname)
        if sub is None:
            cheapest = self.r.ctx.prices.cheapest()
            sub = new_subtask(
                self.r.swarm.id, cname, len(self.r.subs), SubtaskKind.compressor, cheapest.name,
                target, depends_on=[name], system_prompt=COMPRESSOR_SYSTEM,
                prompt=f"Compress the result of agent {name!r} to at most {target} tokens:\n\n"
                       f"{text}")
            self.r.add_subtasks([sub])
            await self.r.commit(new=[sub])
        if sub.status == SubtaskStatus.pending:
            sub.ready_at = utcnow()
            async with self._slots(sub):
                await self._call(sub, [{"role": "system", "content": self._system(sub)},
                                       {"role": "user", "content": self._prompt(sub)}])
        return sub.output if sub.status == SubtaskStatus.succeeded else None

