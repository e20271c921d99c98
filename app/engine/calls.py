"""One logical gateway call of a subtask: reserve before each attempt, bill after it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from app import metrics, tracing
from app.db.tables import Subtask
from app.db.types import utcnow
from app.engine.budget import Reservation, SharedCap
from app.gateway.client import AttemptRecord

if TYPE_CHECKING:
    from app.engine.runner import SwarmRunner

Row = dict[str, Any]


def idempotency_key(swarm_id: str, name: str, call_no: int) -> str:
    """`<swarm id>:<subtask name>:<n>`: the same across retries and takeovers of one call."""
    return f"{swarm_id}:{name}:{call_no}"


@dataclass
class CallMeter:
    """Budget reservations, ledger rows, totals and metrics for one logical call.

    `before`/`after` are the gateway client's attempt hooks; `release` frees whatever an
    abandoned attempt still holds. Rows of the successful attempt are kept in `ok_rows` so the
    caller commits them together with the subtask's result.
    """

    runner: SwarmRunner
    sub: Subtask
    worst: Decimal
    key: str
    label: str
    ok_rows: list[Row] = field(default_factory=list)
    _held: list[Reservation] = field(default_factory=list)
    _held_daily: list[Reservation] = field(default_factory=list)
    _last_outcome: str | None = None

    @property
    def _daily(self) -> SharedCap | None:
        return self.runner.ctx.daily

    async def before(self, attempt: int) -> None:
        if attempt > 1 and self._last_outcome is not None:
            metrics.gateway_retries.labels(self.label, self._last_outcome).inc()
        asked = time.monotonic()
        reservation = await self.runner.budget.reserve(self.worst)
        if (waited := time.monotonic() - asked) > 0.001:
            tracing.event("budget_wait", seconds=round(waited, 6), reserved_usd=str(self.worst))
        if self._daily is not None:
            try:
                self._held_daily.append(await self._daily.reserve(self.worst))
            except BaseException:
                self.runner.budget.settle(reservation, Decimal(0))
                raise
        self._held.append(reservation)
        self.sub.attempts += 1

    async def after(self, rec: AttemptRecord) -> None:
        u = rec.usage
        cost = self.runner.ctx.prices[self.sub.model].cost(u.prompt_tokens, u.completion_tokens,
                                                           u.cached_tokens)
        if self._daily is not None and self._held_daily:
            # the awaited write comes first: once the swarm's totals include this cost, no
            # other commit may run before its ledger row is queued, or totals and ledger differ
            await self._daily.settle(self._held_daily.pop(), cost)
        row = self._bill(rec, cost)
        self._last_outcome = rec.outcome
        if rec.outcome == "ok":
            self.ok_rows.append(row)
        else:
            self.runner.commit_soon([self.sub], ledger=[row])

    async def release(self) -> None:
        for r in self._held:
            self.runner.budget.settle(r, Decimal(0))
        self._held.clear()
        if self._daily is not None and self._held_daily:
            # free the daily share of an abandoned attempt even while being cancelled
            await asyncio.shield(_settle_zero(self._daily, list(self._held_daily)))
            self._held_daily.clear()

    def _bill(self, rec: AttemptRecord, cost: Decimal) -> Row:
        """Settle the swarm budget, add to subtask and swarm totals, and make the ledger row
        (synchronous: nothing can commit between the totals and the row's queueing)."""
        runner, sub, u = self.runner, self.sub, rec.usage
        if self._held:
            runner.budget.settle(self._held.pop(), cost)
        else:
            runner.budget.record(cost)
        sub.prompt_tokens += u.prompt_tokens
        sub.completion_tokens += u.completion_tokens
        sub.cost_usd += cost
        swarm = runner.swarm
        swarm.prompt_tokens += u.prompt_tokens
        swarm.completion_tokens += u.completion_tokens
        swarm.gateway_calls += 1
        metrics.gateway_requests.labels(self.label, rec.outcome).inc()
        metrics.gateway_duration.labels(self.label, rec.outcome).observe(rec.latency_s)
        metrics.tokens_total.labels(self.label, "prompt").inc(u.prompt_tokens)
        metrics.tokens_total.labels(self.label, "completion").inc(u.completion_tokens)
        metrics.spend_total.labels(self.label).inc(float(cost))
        return {
            "swarm_id": swarm.id, "tenant": swarm.tenant, "subtask_name": sub.name,
            "model": sub.model, "idempotency_key": self.key, "attempt": sub.attempts,
            "http_status": rec.status_code, "outcome": rec.outcome,
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "cached_tokens": u.cached_tokens, "cost_usd": cost,
            "latency_ms": round(rec.latency_s * 1000, 3), "created_at": utcnow(),
        }


async def _settle_zero(cap: SharedCap, reservations: list[Reservation]) -> None:
    for r in reservations:
        await cap.settle(r, Decimal(0))
