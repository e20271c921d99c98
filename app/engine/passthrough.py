"""A caller's chat completion sent to the gateway as it is (the OpenAI facade without
`agent_swarm`), metered like any call of a swarm: the worst case reserved on the daily caps
before each attempt and settled to the real cost after it, one ledger row per attempt (swarm
and subtask NULL), and the gateway metrics."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from app import metrics
from app.db import passthrough as ledger
from app.db.retry import in_transaction
from app.db.session import SessionFactory
from app.db.types import utcnow
from app.engine.budget import Reservation, SharedCap
from app.gateway.client import AttemptRecord
from app.pricing import ModelPrice

log = logging.getLogger(__name__)
MESSAGE_OVERHEAD_TOKENS = 8  # per message, as the engine bounds a prompt


def prompt_bound(messages: Sequence[dict[str, Any]]) -> int:
    """An upper bound of the prompt's tokens: UTF-8 bytes of every message (a token is at
    least one byte) plus a per-message overhead, as the engine reserves for its calls."""
    total = MESSAGE_OVERHEAD_TOKENS
    for m in messages:
        total += len(repr(m).encode("utf-8", "replace")) + MESSAGE_OVERHEAD_TOKENS
    return total


def call_key() -> str:
    """The passthrough call's Idempotency-Key (and ledger key): unique per request."""
    return f"chatcmpl-{uuid.uuid4().hex}"


@dataclass
class PassthroughMeter:
    """Reservations, ledger rows and metrics for one forwarded request (all its attempts).

    `before`/`after` are the gateway client's attempt hooks; `release` frees what an attempt
    that never reported back still holds (a cancelled request).
    """

    sessions: SessionFactory
    price: ModelPrice
    caps: Sequence[SharedCap]
    tenant: str
    worst: Decimal
    key: str = field(default_factory=call_key)
    lease_s: float = 15.0
    _held: list[tuple[SharedCap, Reservation]] = field(default_factory=list)
    _last_outcome: str | None = None

    @property
    def label(self) -> str:
        return self.price.name

    async def before(self, attempt: int) -> None:
        if attempt > 1 and self._last_outcome is not None:
            metrics.gateway_retries.labels(self.label, self._last_outcome).inc()
        held: list[tuple[SharedCap, Reservation]] = []
        try:
            for cap in self.caps:
                held.append((cap, await cap.reserve(self.worst)))
        except BaseException:
            await asyncio.shield(_settle_zero(held))
            raise
        self._held = held

    async def after(self, rec: AttemptRecord) -> None:
        u = rec.usage
        cost = self.price.cost(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
        held, self._held = self._held, []
        for cap, reservation in held:
            await cap.settle(reservation, cost)
        self._last_outcome = rec.outcome
        row = {
            "swarm_id": None, "tenant": self.tenant, "subtask_name": None,
            "model": self.price.name, "idempotency_key": self.key, "attempt": rec.attempt,
            "http_status": rec.status_code, "outcome": rec.outcome,
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "cached_tokens": u.cached_tokens, "cost_usd": cost,
            "latency_ms": round(rec.latency_s * 1000, 3), "created_at": utcnow(),
        }
        # shielded: money already spent reaches the ledger even when the request is cancelled
        await asyncio.shield(in_transaction(
            self.sessions, lambda s: ledger.insert_calls(s, [row]), retry_for_s=self.lease_s))
        metrics.gateway_requests.labels(self.label, rec.outcome).inc()
        metrics.gateway_duration.labels(self.label, rec.outcome).observe(rec.latency_s)
        metrics.tokens_total.labels(self.label, "prompt").inc(u.prompt_tokens)
        metrics.tokens_total.labels(self.label, "completion").inc(u.completion_tokens)
        metrics.spend_total.labels(self.label).inc(float(cost))
        if not rec.usage_reported:
            log.warning("gateway stream reported no usage; billed its upper bound (%s USD)", cost)

    def finished(self, finish_reason: str) -> None:
        """Count the answer's finish reason (as the engine does for its calls)."""
        metrics.finish_reasons.labels(self.label, metrics.finish_label(finish_reason)).inc()

    async def release(self) -> None:
        held, self._held = self._held, []
        await asyncio.shield(_settle_zero(held))


async def _settle_zero(held: Sequence[tuple[SharedCap, Reservation]]) -> None:
    for cap, reservation in held:
        await cap.settle(reservation, Decimal(0))
