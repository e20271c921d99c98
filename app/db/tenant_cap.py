"""The tenant daily cap's rows: the same reserve / settle / refresh contract as `spend.py`'s
global cap.

Repository functions: they take a session and never commit; the caller owns the transaction.
On PostgreSQL the cap's batches are also migration 0014's function, sent as a statement of its
own (`tenant_ops_statement`) or inside a creation's (`CapAsk`): one round trip each where the
ORM took four or five.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    Select,
    case,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.changes import TenantSettle
from app.db.session import db_now, is_postgres
from app.db.spend import DailyCheck
from app.db.tenant_tables import TenantDailyReservation, TenantDailySpend


def spent_of(tenant: Any, day: Any) -> Select[Decimal]:
    return select(TenantDailySpend.spent_usd).where(
        TenantDailySpend.tenant == tenant, TenantDailySpend.day == day)


async def tenant_spent(session: AsyncSession, tenant: str, day: date) -> Decimal:
    """Settled spend of a tenant on one UTC day."""
    value = (await session.execute(spent_of(tenant, day))).scalar_one_or_none()
    return value or Decimal(0)


async def _left(session: AsyncSession, tenant: str, cap: Decimal, day: date,
                now: datetime) -> tuple[Decimal, int]:
    """Left of the tenant's cap, and its live reservations: an expired one holds its amount
    too, as the global cap's do (spend._left_today)."""
    spent = await tenant_spent(session, tenant, day)
    held, live = (await session.execute(
        select(func.sum(TenantDailyReservation.amount),
               func.count(case((TenantDailyReservation.expires_at > now, 1))))
        .where(TenantDailyReservation.tenant == tenant, TenantDailyReservation.day == day))
    ).one()
    return cap - spent - (held or Decimal(0)), int(live or 0)


async def tenant_left(session: AsyncSession, tenant: str, cap: Decimal) -> Decimal:
    """A read-only look at what is left of the tenant's cap today (nothing locked)."""
    now, day = await today(session)
    return (await _left(session, tenant, cap, day, now))[0]


async def today(session: AsyncSession) -> tuple[datetime, date]:
    now = await db_now(session)
    return now, now.astimezone(UTC).date()


@dataclass(frozen=True, slots=True)
class Settle:
    """A reservation to replace by the real cost, on the day it was made."""

    reservation_id: str
    day: date
    actual: Decimal


async def settle_tenants(session: AsyncSession, settles: Sequence[TenantSettle]) -> None:
    """Apply settlements in the caller's transaction (SQLite's group commit, and the salvage
    of a refused write's money on either database), each tenant's as its cap's batch does."""
    by_tenant: dict[str, list[Settle]] = {}
    for op in settles:
        by_tenant.setdefault(op.tenant, []).append(Settle(op.reservation_id, op.day, op.actual))
    for tenant, ops in sorted(by_tenant.items()):  # one lock order: the tenants' day rows
        await apply_tenant_ops(session, tenant, Decimal(0), (), ops, "", 0.0)


@dataclass(frozen=True, slots=True)
class CapAsk:
    """Reservations against a tenant's daily cap asked by another statement than the cap's
    batches (a swarm's creation, for the calls it writes ahead: `create.Ahead`), one per
    ledger row, by its `idempotency_key`, in order."""

    tenant: str
    cap: Decimal
    owner: str
    lease_s: float
    amounts: tuple[Decimal, ...]
    keys: tuple[str, ...]

    async def apply(self, session: AsyncSession) -> list[DailyCheck]:
        """In the caller's transaction (SQLite's creation, which runs statement by statement)."""
        return await apply_tenant_ops(session, self.tenant, self.cap, self.amounts, (),
                                      self.owner, self.lease_s)


async def apply_tenant_ops(session: AsyncSession, tenant: str, cap: Decimal,
                           reserves: Sequence[Decimal], settles: Sequence[Settle],
                           owner: str, lease_s: float) -> list[DailyCheck]:
    """Settle, then reserve what fits (in order) against the tenant's cap for today, in the
    caller's transaction; one DailyCheck per amount of `reserves`.

    The tenant's day row is the lock every process serialises on (PostgreSQL: an upsert that
    updates it; SQLite: the first write locks the file), so no two processes see the same
    money as free; one transaction serves a whole batch of calls (a group commit for the
    cap). A settlement adds its cost only while its reservation is there (or older than
    yesterday, which a cleanup may have taken): a batch retried after its answer was lost
    adds nothing twice."""
    if is_postgres(session):
        return await _apply_tenant_ops_pg(session, tenant, cap, reserves, settles, owner,
                                          lease_s)
    now, day = await today(session)
    await session.execute(sqlite.insert(TenantDailySpend)
                          .values(tenant=tenant, day=day, spent_usd=Decimal(0))
                          .on_conflict_do_nothing(index_elements=["tenant", "day"]))
    if settles:
        ids = [op.reservation_id for op in settles]
        there = set((await session.execute(select(TenantDailyReservation.id).where(
            TenantDailyReservation.id.in_(ids), TenantDailyReservation.tenant == tenant))
        ).scalars())
        for when, actual in _by_day([op for op in settles if op.reservation_id in there
                                     or op.day < day - timedelta(days=1)]).items():
            if actual:
                await _add_spent(session, tenant, when, actual)
        await session.execute(delete(TenantDailyReservation).where(
            TenantDailyReservation.id.in_(ids)))
    if not reserves:
        return []
    # a dead process's reservations hold their day's money (_left), that day only
    await session.execute(delete(TenantDailyReservation).where(
        TenantDailyReservation.tenant == tenant,
        TenantDailyReservation.day < day - timedelta(days=1)))
    left, live = await _left(session, tenant, cap, day, now)
    return await _grant(session, tenant, reserves, left, live, day, now, owner, lease_s)


# PostgreSQL's batch is one statement: migration 0014's `tenant_cap_apply`, the same steps in
# the same order (the tenant's day row locked first; the reads after it see what its last holder
# committed). Through the ORM it is a transaction of up to five round trips, twice for every
# call of a tenant with a cap (every tenant by default).
_APPLY = ("SELECT o_day, o_ids, o_left, o_live FROM tenant_cap_apply($1::varchar, $2::numeric, "
          "$3::varchar[], $4::numeric[], $5::date[], $6::numeric[], $7::varchar, $8::float8)")


def tenant_ops_statement(tenant: str, cap: Decimal, reserves: Sequence[Decimal],
                         settles: Sequence[Settle], owner: str, lease_s: float
                         ) -> tuple[str, tuple[Any, ...]]:
    """`apply_tenant_ops` on PostgreSQL as one statement and its arguments (for the caller's
    transaction, or alone in autocommit: `tenant_checks` reads its answer)."""
    return _APPLY, (tenant, cap, [op.reservation_id for op in settles],
                    [op.actual for op in settles], [op.day for op in settles], list(reserves),
                    owner, float(lease_s))


def tenant_checks(row: Sequence[Any]) -> list[DailyCheck]:
    """One DailyCheck per reservation asked, from `tenant_ops_statement`'s row."""
    day, ids, lefts, lives = row
    return [DailyCheck(day, rid, left, int(live))
            for rid, left, live in zip(ids or (), lefts or (), lives or (), strict=True)]


async def _apply_tenant_ops_pg(session: AsyncSession, tenant: str, cap: Decimal,
                               reserves: Sequence[Decimal], settles: Sequence[Settle],
                               owner: str, lease_s: float) -> list[DailyCheck]:
    sql, args = tenant_ops_statement(tenant, cap, reserves, settles, owner, lease_s)
    conn = await session.connection()
    return tenant_checks((await conn.exec_driver_sql(sql, args)).one())


def _by_day(settles: Sequence[Settle]) -> dict[date, Decimal]:
    """Settlements summed per day they were reserved on (settled first: the money they free
    is there for the batch's reservations)."""
    out: dict[date, Decimal] = {}
    for op in settles:
        out[op.day] = out.get(op.day, Decimal(0)) + op.actual
    return out


async def _add_spent(session: AsyncSession, tenant: str, day: date, actual: Decimal) -> None:
    """SQLite: `actual` added to the tenant's spend on `day` (its row made if it has none)."""
    await session.execute(sqlite.insert(TenantDailySpend)
                          .values(tenant=tenant, day=day, spent_usd=actual)
                          .on_conflict_do_update(index_elements=["tenant", "day"], set_={
                              "spent_usd": TenantDailySpend.spent_usd + actual}))


async def _grant(session: AsyncSession, tenant: str, reserves: Sequence[Decimal],
                 left: Decimal, live: int, day: date, now: datetime, owner: str,
                 lease_s: float) -> list[DailyCheck]:
    """Reserve, in order, each amount that fits in what is `left` (one that does not is
    refused, and later smaller ones may still fit)."""
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
