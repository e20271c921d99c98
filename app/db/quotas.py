"""Tenant quotas in the database: the shared token bucket, per-tenant counts and the tenant
daily cap's rows (the same reserve / settle / refresh contract as `spend.py`'s global cap).

Repository functions: they take a session and never commit; the caller owns the transaction.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, delete, func, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.session import db_now, is_postgres
from app.db.spend import DailyCheck
from app.db.tables import Swarm, TenantBucket, TenantDailyReservation, TenantDailySpend
from app.states import ACTIVE_SWARM as ACTIVE
from app.states import SwarmStatus

ACTIVE_VALUES = (SwarmStatus.queued.value, *(s.value for s in ACTIVE))


# ---- the token bucket -----------------------------------------------------------------------


def _clock(session: AsyncSession) -> ColumnElement[Any]:
    """Seconds since the epoch: the database's clock on PostgreSQL (replicas' clocks may
    differ), this process's on SQLite (one process)."""
    if is_postgres(session):
        return func.extract("epoch", func.now())
    return literal(time.time())


async def take_token(session: AsyncSession, tenant: str, size: float,
                     refill_per_s: float) -> float | None:
    """Take one token from the tenant's bucket in one atomic statement; None when taken, else
    the seconds until one will be there (nothing changes then).

    The row holds (tokens, updated_at); the upsert refills it for the time elapsed, capped at
    `size`, and takes a token only when at least one is there. Concurrent requests of one
    tenant serialise on the row, so replicas can never hand out the same token twice."""
    pg = is_postgres(session)
    now = _clock(session)
    least, greatest = (func.least, func.greatest) if pg else (func.min, func.max)
    elapsed = greatest(now - TenantBucket.updated_at, 0)
    refilled = least(TenantBucket.tokens + elapsed * refill_per_s, size)
    insert = postgresql.insert if pg else sqlite.insert
    stmt = (insert(TenantBucket)
            .values(tenant=tenant, tokens=size - 1, updated_at=now)
            .on_conflict_do_update(index_elements=["tenant"],
                                   set_={"tokens": refilled - 1, "updated_at": now},
                                   where=refilled >= 1)
            .returning(TenantBucket.tokens))
    if (await session.execute(stmt)).first() is not None:
        return None
    row = (await session.execute(
        select(refilled).where(TenantBucket.tenant == tenant))).one()
    return max((1 - float(row[0])) / refill_per_s, 0.001)


# ---- counts ---------------------------------------------------------------------------------


async def active_swarms(session: AsyncSession, tenant: str) -> int:
    """The tenant's queued + planning + running + synthesizing swarms (an index range scan
    over its own rows only)."""
    stmt = select(func.count()).where(Swarm.tenant == tenant, Swarm.status.in_(ACTIVE_VALUES))
    return int((await session.execute(stmt)).scalar_one())


# ---- the tenant daily cap -------------------------------------------------------------------


async def tenant_spent(session: AsyncSession, tenant: str, day: date) -> Decimal:
    """Settled spend of a tenant on one UTC day."""
    value = (await session.execute(
        select(TenantDailySpend.spent_usd)
        .where(TenantDailySpend.tenant == tenant, TenantDailySpend.day == day)
    )).scalar_one_or_none()
    return value or Decimal(0)


async def _left(session: AsyncSession, tenant: str, cap: Decimal, day: date,
                now: datetime) -> tuple[Decimal, int]:
    spent = await tenant_spent(session, tenant, day)
    held, live = (await session.execute(
        select(func.sum(TenantDailyReservation.amount), func.count())
        .where(TenantDailyReservation.tenant == tenant, TenantDailyReservation.day == day,
               TenantDailyReservation.expires_at > now))).one()
    return cap - spent - (held or Decimal(0)), int(live)


async def today(session: AsyncSession) -> tuple[datetime, date]:
    now = await db_now(session)
    return now, now.astimezone(UTC).date()


@dataclass(frozen=True, slots=True)
class Settle:
    """A reservation to replace by the real cost, on the day it was made."""

    reservation_id: str
    day: date
    actual: Decimal


async def apply_tenant_ops(session: AsyncSession, tenant: str, cap: Decimal,
                           reserves: Sequence[Decimal], settles: Sequence[Settle],
                           owner: str, lease_s: float) -> list[DailyCheck]:
    """Settle, then reserve what fits (in order) against the tenant's cap for today, in the
    caller's transaction; one DailyCheck per amount of `reserves`.

    The tenant's day row is the lock every process serialises on (PostgreSQL: upsert + FOR
    UPDATE; SQLite: the first write locks the file), so no two processes see the same money
    as free; one transaction serves a whole batch of calls (a group commit for the cap)."""
    now, day = await today(session)
    pg = is_postgres(session)
    insert = postgresql.insert if pg else sqlite.insert
    await session.execute(insert(TenantDailySpend)
                          .values(tenant=tenant, day=day, spent_usd=Decimal(0))
                          .on_conflict_do_nothing(index_elements=["tenant", "day"]))
    if pg:
        await session.execute(select(TenantDailySpend.day).where(
            TenantDailySpend.tenant == tenant, TenantDailySpend.day == day).with_for_update())
    spent_by_day: dict[date, Decimal] = {}
    for op in settles:  # settled first: the money they free is there for this batch
        spent_by_day[op.day] = spent_by_day.get(op.day, Decimal(0)) + op.actual
    for when, actual in spent_by_day.items():
        if actual:
            await session.execute(update(TenantDailySpend).where(
                TenantDailySpend.tenant == tenant, TenantDailySpend.day == when)
                .values(spent_usd=TenantDailySpend.spent_usd + actual))
    if settles:
        await session.execute(delete(TenantDailyReservation).where(
            TenantDailyReservation.id.in_([op.reservation_id for op in settles])))
    if not reserves:
        return []
    # expired rows belong to crashed processes: they no longer hold anything
    await session.execute(delete(TenantDailyReservation).where(
        TenantDailyReservation.tenant == tenant, TenantDailyReservation.day == day,
        TenantDailyReservation.expires_at <= now))
    left, live = await _left(session, tenant, cap, day, now)
    out: list[DailyCheck] = []
    rows: list[dict[str, Any]] = []
    for amount in reserves:
        if amount > left:
            out.append(DailyCheck(day, None, left, live))
            continue
        rid = uuid.uuid4().hex
        rows.append({"id": rid, "tenant": tenant, "day": day, "owner": owner,
                     "amount": amount, "expires_at": now + timedelta(seconds=lease_s)})
        out.append(DailyCheck(day, rid, left, live))
        left, live = left - amount, live + 1
    if rows:
        await session.execute(insert(TenantDailyReservation), rows)
    return out


async def refresh_tenant(session: AsyncSession, reservation_ids: Sequence[str],
                         lease_s: float) -> None:
    """Push the expiry of this process's live tenant reservations one lease ahead."""
    if not reservation_ids:
        return
    now = await db_now(session)
    await session.execute(update(TenantDailyReservation)
                          .where(TenantDailyReservation.id.in_(list(reservation_ids)))
                          .values(expires_at=now + timedelta(seconds=lease_s)))


def seconds_to_midnight(now: datetime) -> int:
    """Until the next UTC day, when a tenant's daily cap starts afresh."""
    utc = now.astimezone(UTC)
    midnight = datetime.combine(utc.date() + timedelta(days=1), datetime.min.time(), UTC)
    return max(math.ceil((midnight - utc).total_seconds()), 1)
