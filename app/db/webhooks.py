"""Repository functions for webhook deliveries (the caller owns the transaction)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.session import db_now
from app.db.tables import Webhook, WebhookAttempt
from app.states import WebhookState, webhook_transition


def new_delivery(swarm_id: str, url: str, now: datetime) -> dict[str, Any]:
    """The row that makes a terminal swarm's webhook due now."""
    return {"swarm_id": swarm_id, "url": url, "state": WebhookState.pending, "attempts": 0,
            "next_attempt_at": now, "created_at": now, "finished_at": None}


async def claim_due(session: AsyncSession, limit: int, hold_s: float) -> list[Webhook]:
    """Take due deliveries, pushing their next attempt `hold_s` ahead so no other process sends
    them meanwhile (SKIP LOCKED keeps concurrent claimers apart on Postgres)."""
    now = await db_now(session)
    rows = list((await session.execute(
        select(Webhook)
        .where(Webhook.state == WebhookState.pending, Webhook.next_attempt_at <= now)
        .order_by(Webhook.next_attempt_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )).scalars())
    if rows:
        await session.execute(
            update(Webhook)
            .where(Webhook.swarm_id.in_([r.swarm_id for r in rows]))
            .values(next_attempt_at=now + timedelta(seconds=hold_s)))
    return rows


async def record_attempt(session: AsyncSession, hook: Webhook, status: int | None,
                         error: str | None, latency_ms: float, retry_in_s: float | None,
                         give_up_after_s: float) -> WebhookState:
    """Write one attempt and the delivery's new state: delivered, pending (retry) or failed."""
    now = await db_now(session)
    attempt = hook.attempts + 1
    await session.execute(insert(WebhookAttempt).values(
        swarm_id=hook.swarm_id, attempt=attempt, status_code=status, error=error,
        latency_ms=latency_ms, created_at=now))
    if status is not None and 200 <= status < 300:
        state, next_at = WebhookState.delivered, now
    elif retry_in_s is not None and (now - hook.created_at).total_seconds() + retry_in_s \
            <= give_up_after_s:
        state, next_at = WebhookState.pending, now + timedelta(seconds=retry_in_s)
    else:
        state, next_at = WebhookState.failed, now
    state = webhook_transition(hook.state, state)
    await session.execute(update(Webhook).where(Webhook.swarm_id == hook.swarm_id).values(
        attempts=attempt, state=state, next_attempt_at=next_at,
        finished_at=now if state.terminal else None))
    return state
