"""Repository functions for webhook deliveries (the caller owns the transaction)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, literal_column, select, text, true, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import table_of
from app.db.session import db_now, is_postgres
from app.db.tables import Webhook, WebhookAttempt
from app.db.types import utcnow
from app.states import WebhookState, webhook_transition


def new_delivery(swarm_id: str, tenant: str, url: str, now: datetime) -> dict[str, Any]:
    """The row that makes a terminal swarm's webhook due now."""
    return {"swarm_id": swarm_id, "tenant": tenant, "url": url, "state": WebhookState.pending,
            "attempts": 0, "next_attempt_at": now, "created_at": now, "finished_at": None}


# Fair deliveries (SPEC §8), as fair claims of swarms: a due delivery's priority is its tenant's
# deliveries in flight here (`busy`) + its rank among the tenant's due ones (earliest = 1), and
# no tenant passes `per_tenant` in flight; so one tenant's backlog, however long, delays another
# tenant's delivery by nothing while a slot is free. The tenants with a pending delivery are
# found by a skip scan of ix_webhooks_pending_tenant (a lookup per tenant) and each gives at
# most `per_tenant` of its earliest due (an index range each): the statement reads
# tenants x per_tenant rows, never a tenant's whole backlog.
_DUE = WebhookState.pending
_COLUMNS = table_of(Webhook).columns  # named: a migration added `tenant` at the end
_PG_CLAIM = text(f"""
WITH RECURSIVE tenants AS (
    (SELECT tenant FROM webhooks WHERE state = '{_DUE}' ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT w.tenant FROM webhooks w
            WHERE w.state = '{_DUE}' AND w.tenant > t.tenant ORDER BY w.tenant LIMIT 1)
    FROM tenants t WHERE t.tenant IS NOT NULL
),
busy AS (
    SELECT * FROM unnest(CAST(:busy_tenants AS text[]), CAST(:busy_counts AS int[]))
        AS b(tenant, n)
),
picked AS MATERIALIZED (
    SELECT d.swarm_id, COALESCE(b.n, 0) + d.rank AS prio, d.next_attempt_at AS due_at
    FROM tenants t
    LEFT JOIN busy b ON b.tenant = t.tenant
    CROSS JOIN LATERAL (
        SELECT e.*, row_number() OVER (ORDER BY e.next_attempt_at) AS rank
        FROM (SELECT w.swarm_id, w.next_attempt_at FROM webhooks w
              WHERE w.tenant = t.tenant AND w.state = '{_DUE}' AND w.next_attempt_at <= now()
              ORDER BY w.next_attempt_at
              LIMIT GREATEST(:per_tenant - COALESCE(b.n, 0), 0)) e
    ) d
    WHERE t.tenant IS NOT NULL
    ORDER BY prio, due_at
    LIMIT :limit
),
-- by key (the plan kept for any arguments must not guess a join's size): only the picked
-- rows are locked, and those another claimer holds are left to it
locked AS MATERIALIZED (
    SELECT w.swarm_id FROM webhooks w
    WHERE w.swarm_id = ANY(ARRAY(SELECT swarm_id FROM picked))
      AND w.state = '{_DUE}' AND w.next_attempt_at <= now()
    FOR UPDATE SKIP LOCKED
),
held AS (
    UPDATE webhooks AS w SET next_attempt_at = now() + make_interval(secs => :hold)
    WHERE w.swarm_id = ANY(ARRAY(SELECT swarm_id FROM locked))
    RETURNING w.*
)
SELECT {", ".join(f"held.{c.name}" for c in _COLUMNS)}
FROM held JOIN picked ON picked.swarm_id = held.swarm_id ORDER BY picked.prio, picked.due_at
""").columns(*_COLUMNS)


async def claim_due(session: AsyncSession, limit: int, hold_s: float, per_tenant: int,
                    busy: Mapping[str, int]) -> list[Webhook]:
    """Take up to `limit` due deliveries, round-robin across tenants, none of a tenant beyond
    `per_tenant` counting its `busy` ones (in flight in this process; see _PG_CLAIM), pushing
    their next attempt `hold_s` ahead so no other process sends them meanwhile (SKIP LOCKED
    keeps concurrent claimers apart on PostgreSQL)."""
    if limit <= 0:
        return []
    if is_postgres(session):
        rows = await session.execute(
            select(Webhook).from_statement(_PG_CLAIM),
            {"busy_tenants": list(busy), "busy_counts": list(busy.values()),
             "per_tenant": per_tenant, "limit": limit, "hold": float(hold_s)})
        return list(rows.scalars())
    return await _claim_in_order(session, limit, hold_s, per_tenant, busy)


# a literal, not a bound value: SQLite uses a partial index only for its WHERE's very term
_PENDING = Webhook.state == literal_column(f"'{WebhookState.pending.value}'")


async def _claim_in_order(session: AsyncSession, limit: int, hold_s: float, per_tenant: int,
                          busy: Mapping[str, int]) -> list[Webhook]:
    """_PG_CLAIM on SQLite, a statement per tenant (one process: no row locks to skip)."""
    now = utcnow()
    ranked: list[tuple[int, datetime, str]] = []
    for tenant in await _pending_tenants(session):
        room = per_tenant - busy.get(tenant, 0)
        if room <= 0:
            continue
        due = await session.execute(
            select(Webhook.swarm_id, Webhook.next_attempt_at)
            .where(Webhook.tenant == tenant, _PENDING, Webhook.next_attempt_at <= now)
            .order_by(Webhook.next_attempt_at).limit(room))
        ranked += [(per_tenant - room + rank, at, swarm_id)
                   for rank, (swarm_id, at) in enumerate(due, 1)]
    picked = [swarm_id for _, _, swarm_id in sorted(ranked)[:limit]]
    if not picked:
        return []
    rows = await session.execute(
        update(Webhook).where(Webhook.swarm_id.in_(picked))
        .values(next_attempt_at=now + timedelta(seconds=hold_s))
        .returning(Webhook), execution_options={"synchronize_session": False})
    order = {swarm_id: i for i, swarm_id in enumerate(picked)}
    return sorted(rows.scalars(), key=lambda hook: order[hook.swarm_id])


async def _pending_tenants(session: AsyncSession) -> list[str]:
    """The tenants with a pending delivery, a lookup of the index each (_PG_CLAIM's skip scan:
    a DISTINCT reads every pending row)."""
    tenants: list[str] = []
    while True:
        after = Webhook.tenant > tenants[-1] if tenants else true()
        tenant = (await session.execute(
            select(func.min(Webhook.tenant))
            .where(_PENDING, after))).scalar_one()
        if tenant is None:
            return tenants
        tenants.append(tenant)


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
    # only the delivery that was claimed: one that replaced it meanwhile (an approval notice
    # followed by the decision's end) is due on its own, never marked sent by this attempt
    await session.execute(update(Webhook).where(
        Webhook.swarm_id == hook.swarm_id, Webhook.created_at == hook.created_at,
        Webhook.attempts == hook.attempts).values(
        attempts=attempt, state=state, next_attempt_at=next_at,
        finished_at=now if state.terminal else None))
    return state
