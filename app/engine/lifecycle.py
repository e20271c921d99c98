"""The steps every subtask takes, whatever it is: its slots, its start, one logical gateway
call, and its end — succeeded, failed, or stopping the whole swarm."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from app import metrics, tracing
from app.db.tables import Subtask
from app.db.types import utcnow
from app.engine.budget import BudgetExceeded
from app.engine.calls import CallMeter, idempotency_key
from app.engine.context import estimate_prompt_tokens, estimate_request_tokens
from app.engine.faults import crash_point
from app.engine.outputs import response_format as schema_format
from app.engine.outputs import schema_tokens, schemas_of
from app.engine.owned_swarm import EventRow, LedgerRow, Outcome, OwnedSwarm, failure
from app.engine.writer import WriteRejected
from app.gateway.chat import ChatRequest, ChatResult
from app.gateway.errors import GatewayRejected, GatewayUnavailable
from app.pricing import metric_model_label
from app.states import SubtaskKind, SubtaskStatus, SwarmStatus, move_subtask, retract_subtask

# what a gateway call may raise besides cancellation and a lost lease
CALL_FAILURES = (BudgetExceeded, GatewayRejected, GatewayUnavailable, WriteRejected)


def unstorable(exc: WriteRejected) -> dict[str, Any]:
    return failure("output_unstorable", "the database refused to store this subtask's result; "
                   "its spend is recorded", refused_by=str(exc))


def refused_result(sub: Subtask, row: EventRow, err: dict[str, Any]) -> None:
    """A success whose write the database refused never happened: the subtask fails instead,
    and its `subtask.failed` takes the refused event's number (the swarm's events stay
    consecutive)."""
    retract_subtask(sub, SubtaskStatus.running)
    sub.output = None
    failed = move_subtask(sub, SubtaskStatus.failed, utcnow(), kind=sub.kind, error=err)
    assert failed is not None
    sub.error = err
    row["type"], row["data"] = failed.type, failed.data


class Slots:
    """Semaphores taken in order and given back in reverse; with a write-ahead, its permit is
    held from before the meter's `prepare` until the last slot is taken. (A plain class:
    AsyncExitStacks and a generator-based context manager were ~3 % of the engine's CPU per
    subtask.)"""

    __slots__ = ("_ahead", "_held", "_sems")

    def __init__(self, sems: list[asyncio.Semaphore],
                 ahead: tuple[asyncio.Semaphore, CallMeter] | None) -> None:
        self._sems = sems
        self._ahead = ahead
        self._held: list[asyncio.Semaphore] = []

    async def __aenter__(self) -> None:
        try:
            if self._ahead is None:
                await self._take()
                return
            permit, meter = self._ahead
            async with permit:
                await meter.prepare()
                await self._take()
        except BaseException:
            self._give_back()
            raise

    async def _take(self) -> None:
        for sem in self._sems:
            await sem.acquire()
            self._held.append(sem)

    async def __aexit__(self, *exc: object) -> None:
        self._give_back()

    def _give_back(self) -> None:
        while self._held:
            self._held.pop().release()


class SubtaskSteps:
    """The steps of one swarm's subtasks, written through its OwnedSwarm."""

    def __init__(self, owned: OwnedSwarm) -> None:
        self.owned = owned
        self.schemas = schemas_of(owned.spec)  # subtasks with an output schema (SPEC §15)

    def slots(self, sub: Subtask, ahead: CallMeter | None = None) -> Slots:
        """The swarm's slot, a per-model one (when the model table limits it), the tenant's
        and a process-wide one: the swarm's first, so a swarm at its limit holds none of the
        shared ones. With `ahead`, that call's first attempt is written ahead before them
        (`CallMeter.prepare`), by at most `ahead_slots` of the swarm's calls at a time: the
        write-ahead commit then overlaps the calls in flight instead of idling a slot
        (docs/decisions/0003-attempts-written-ahead.md)."""
        ctx = self.owned.ctx
        # the tenant's slot before the process's: a tenant at its limit holds none
        sems = [self.owned.call_slots, ctx.model_slots.get(sub.model),
                ctx.tenant_slot(self.owned.swarm.tenant), ctx.inflight]
        return Slots([s for s in sems if s is not None],
                     None if ahead is None else (self.owned.ahead_slots, ahead))

    def begin(self, sub: Subtask) -> float:
        """Start the subtask (written soon); returns its monotonic start for its latency."""
        started = utcnow()
        event = move_subtask(sub, SubtaskStatus.running, started, kind=sub.kind,
                             model=sub.model)
        assert event is not None
        waited = max((started - (sub.ready_at or started)).total_seconds(), 0.0)
        metrics.child(metrics.queue_wait, sub.kind).observe(waited)
        tracing.event("queue_wait", seconds=waited)
        self.owned.journal.started(sub, self.owned.event(event))
        return time.monotonic()

    def meter(self, sub: Subtask, messages: list[dict[str, Any]], call_no: int,
              tools: list[dict[str, Any]] | None = None) -> CallMeter:
        """The meter of one logical call on the subtask's model: its key, its label, its
        worst case at that model's prices."""
        owned, ctx = self.owned, self.owned.ctx
        key = idempotency_key(owned.swarm.id, sub.name, call_no)
        label = metric_model_label(sub.model, ctx.prices)
        bound = (estimate_prompt_tokens(messages) if tools is None
                 else estimate_request_tokens(messages, tools))
        if (schema := self.schemas.get(sub.name)) is not None:  # sent as response_format
            bound += schema_tokens(schema)
        worst = ctx.prices[sub.model].worst_case(bound, sub.max_tokens)
        return CallMeter(owned, sub, worst, key, label, bound, sub.model)

    async def gateway(self, sub: Subtask, messages: list[dict[str, Any]], call_no: int,
                      response_format: dict[str, Any] | None = None,
                      tools: list[dict[str, Any]] | None = None,
                      meter: CallMeter | None = None
                      ) -> tuple[ChatResult, list[LedgerRow]]:
        """One logical call with retries, on the subtask's model and then, while each is
        down, on the next of its list (SPEC §15); raises the client's errors or
        BudgetExceeded. `meter`: one made (and maybe prepared) by the caller for this call."""
        if meter is None:
            meter = self.meter(sub, messages, call_no, tools)
        while True:
            try:
                return await self._complete(sub, messages, response_format, tools, meter)
            except GatewayUnavailable as exc:
                if not self._fall_back(sub, exc):
                    raise
            # the same logical call (its key), reserved and priced at the next model
            meter = self.meter(sub, messages, call_no, tools)

    async def _complete(self, sub: Subtask, messages: list[dict[str, Any]],
                        response_format: dict[str, str] | None,
                        tools: list[dict[str, Any]] | None, meter: CallMeter
                        ) -> tuple[ChatResult, list[LedgerRow]]:
        """The call on the meter's model, retried by the §4 policy."""
        owned, ctx = self.owned, self.owned.ctx
        key, label = meter.key, meter.label
        if response_format is None and (schema := self.schemas.get(sub.name)) is not None:
            response_format = schema_format(schema, sub.name)
        metrics.child(metrics.subtasks_in_flight, label).inc()
        try:
            result = await ctx.gateway.complete(
                ChatRequest(model=meter.model, messages=messages, max_tokens=sub.max_tokens,
                            temperature=sub.temperature, response_format=response_format,
                            idempotency_key=key, tools=tools, on_delta=self._deltas(sub)),
                max_attempts=int(owned.limits["max_attempts"]),
                timeout_s=float(owned.limits["subtask_timeout_s"]),
                deadline=owned.deadline, before_attempt=meter.before, after_attempt=meter.after)
        finally:
            metrics.child(metrics.subtasks_in_flight, label).dec()
            await meter.release()
        finish = metrics.finish_label(result.finish_reason)
        metrics.child(metrics.finish_reasons, label, finish).inc()
        return result, meter.ok_rows

    def _fall_back(self, sub: Subtask, exc: GatewayUnavailable) -> bool:
        """Move the subtask to the next model of its list when its model is down (attempts
        spent on retryable failures, the deadline not reached); False: none is left. The
        move is written with the subtask's next write: a takeover goes on from there."""
        chain = sub.models or []
        if exc.deadline_hit or sub.model not in chain:
            return False
        at = chain.index(sub.model) + 1
        if at >= len(chain):
            return False
        prices = self.owned.ctx.prices
        was, sub.model, sub.fallbacks = sub.model, chain[at], at
        metrics.child(metrics.model_fallbacks, metric_model_label(was, prices),
                      metric_model_label(sub.model, prices)).inc()
        tracing.event("model_fallback", from_model=was, to_model=sub.model,
                      outcome=exc.outcome)
        self.owned.journal.commit_soon([sub])
        return True

    def _deltas(self, sub: Subtask) -> Callable[[str], None] | None:
        """Where a worker's tokens go as they come, when its swarm streams them (SPEC §10)."""
        owned, notifier = self.owned, self.owned.ctx.notifier
        if (notifier is None or sub.kind is not SubtaskKind.worker
                or not owned.limits.get("stream_tokens")):
            return None
        hub, swarm_id, name = notifier.deltas, owned.swarm.id, sub.name
        return lambda text: hub.publish(swarm_id, name, text)

    def failing(self, sub: Subtask, exc: Exception) -> None:
        """A call failed, its slot still held: a failure that fails the subtask alone (not a
        budget, the deadline, our credentials: those stop the swarm in `call_failed`) is
        counted against the failure tolerance now, before the slot goes to a waiter."""
        if isinstance(exc, GatewayRejected) and exc.status_code in (401, 403):
            return
        if isinstance(exc, GatewayUnavailable) and exc.deadline_hit:
            return
        if isinstance(exc, GatewayRejected | GatewayUnavailable | WriteRejected):
            self.owned.failing(sub.name, _error_of(exc))

    async def call_failed(self, sub: Subtask, t0: float, exc: Exception) -> Outcome:
        """Map a call's failure onto the subtask and, where it must, the swarm."""
        if isinstance(exc, BudgetExceeded):
            # SPEC §5's scopes are `swarm` and `daily`: a tenant's daily cap is a daily one
            metrics.budget_denials.labels("swarm" if exc.scope == "swarm" else "daily").inc()
            code = "budget_exceeded" if exc.scope == "swarm" else "daily_budget_exceeded"
            # a tenant's own cap says so (SPEC §8); the global one keeps its old shape
            scope = {"scope": "tenant"} if exc.scope == "tenant" else {}
            if sub.kind is SubtaskKind.compressor:  # optional: its dependent truncates instead
                return await self.fail(sub, t0, failure(code, str(exc), **scope))
            return self.stop_swarm(sub, failure(code, str(exc), **scope))
        if isinstance(exc, GatewayUnavailable) and exc.deadline_hit:
            return self.stop_swarm(sub, None, self.owned.deadline_error())
        assert isinstance(exc, GatewayRejected | GatewayUnavailable | WriteRejected)
        err = _error_of(exc)
        if isinstance(exc, GatewayRejected) and exc.status_code in (401, 403):
            self.owned.stop_with(SwarmStatus.failed, err)
        return await self.fail(sub, t0, err)

    def stop_swarm(self, sub: Subtask, err: dict[str, Any] | None,
                   swarm_err: dict[str, Any] | None = None) -> Outcome:
        """This subtask's failure ends the swarm (failed); the swarm's end cancels it."""
        if err is not None:
            sub.error = err
        self.owned.stop_with(SwarmStatus.failed, swarm_err or err)
        return Outcome.swarm_stopping

    async def succeed(self, sub: Subtask, t0: float, output: str, rows: list[LedgerRow],
                      new: list[Subtask] | None = None) -> Outcome:
        latency_ms = self._latency(sub, t0, SubtaskStatus.succeeded)
        event = move_subtask(sub, SubtaskStatus.succeeded, utcnow(), kind=sub.kind,
                             latency_ms=latency_ms, truncated=sub.truncated,
                             sanitized=sub.sanitized, **_moved(sub), **_structured(sub))
        assert event is not None
        sub.output = output
        row = self.owned.event(event)
        self.owned.answered(sub)
        if sub.kind is SubtaskKind.synthesizer or (not new and self.owned.last_answer(sub)):
            # the swarm's last result (its synthesizer's, or without one its last worker's):
            # written with the swarm's end, one commit where there were two (the runner's
            # `SwarmEnds.finish`, which fails it if it is refused)
            self.owned.journal.write_with_end([sub], rows, [row])
            return Outcome.succeeded
        try:
            await self.owned.journal.commit([sub], rows, [row], new=new or [])
            crash_point("after_commit", sub.name)  # one held for the end: in `SwarmEnds.finish`
        except WriteRejected as exc:
            # nothing of that write is stored but its ledger rows: the move never happened,
            # and this subtask fails alone
            self.owned.forget_subtasks(new or [])
            self._latency(sub, t0, SubtaskStatus.failed)
            refused_result(sub, row, unstorable(exc))
            await self.owned.journal.commit([sub], events=[row])
            return Outcome.failed
        return Outcome.succeeded

    async def fail(self, sub: Subtask, t0: float, err: dict[str, Any],
                   rows: list[LedgerRow] | None = None) -> Outcome:
        self._latency(sub, t0, SubtaskStatus.failed)
        event = move_subtask(sub, SubtaskStatus.failed, utcnow(), kind=sub.kind, error=err,
                             **_moved(sub), **_structured(sub))
        assert event is not None
        sub.error = err
        self.owned.answered(sub)
        await self.owned.journal.commit([sub], rows or [], [self.owned.event(event)])
        return Outcome.failed

    def _latency(self, sub: Subtask, t0: float, status: SubtaskStatus) -> float:
        sub.latency_ms = round((time.monotonic() - t0) * 1000, 1)
        label = metric_model_label(sub.model, self.owned.ctx.prices)
        metrics.child(metrics.subtask_duration, sub.kind, label, status).observe(
            sub.latency_ms / 1000)
        return sub.latency_ms


def _moved(sub: Subtask) -> dict[str, Any]:
    """What an end's event says of a subtask that fell back: the model it ended on (its
    `subtask.started` named the first)."""
    return {"model": sub.model, "fallbacks": sub.fallbacks} if sub.fallbacks else {}


def _structured(sub: Subtask) -> dict[str, Any]:
    """A schema subtask's event fields (SPEC §15): its parsed value and how it was got."""
    if sub.output_status is None:
        return {}
    return {"output_status": sub.output_status, "output_format": sub.output_format,
            "output_json": sub.output_json}


def _error_of(exc: GatewayRejected | GatewayUnavailable | WriteRejected) -> dict[str, Any]:
    """The subtask's `error` for a call that failed it alone."""
    if isinstance(exc, WriteRejected):
        return unstorable(exc)
    if isinstance(exc, GatewayRejected):
        return failure("gateway_rejected", str(exc), status=exc.status_code)
    return failure("gateway_unavailable", str(exc), status=exc.status_code, outcome=exc.outcome)
