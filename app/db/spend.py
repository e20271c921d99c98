"""Spend across swarms: the daily cap's rows (reserve, settle, refresh) and the usage report.

Repository functions: they take a session and never commit; the caller owns the transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, Date, cast, delete, func, literal_column, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.queries import db_now
from app.db.tables import DailyReservation, DailySpend, GatewayCall
from app.schemas import GroupBy


def _is_pg(session: AsyncSession) -> bool:
    return session.get_bind().dialect.name == "postgresql"


# ---- the daily cap --------------------------------------------------------------------------


@dataclass(frozen=True)
class DailyCheck:
    """The outcome of one reservation attempt against the day's cap."""

    day: date
    reservation_id: str | None  # set when the amount fitted and is now held
    left: Decimal  # cap - settled - live reservations, before this one
    live: int  # reservations still in flight (anyone's): they may free money


async def _left_today(session: AsyncSession, cap: Decimal, day: date,
                      now: datetime) -> tuple[Decimal, int]:
    spent = (await session.execute(
        select(DailySpend.spent_usd).where(DailySpend.day == day))).scalar_one_or_none()
    held, live = (await session.execute(
        select(func.sum(DailyReservation.amount), func.count())
        .where(DailyReservation.day == day, DailyReservation.expires_at > now))).one()
    return cap - (spent or Decimal(0)) - (held or Decimal(0)), int(live)


async def peek_daily(session: AsyncSession, cap: Decimal) -> DailyCheck:
    """A read-only look at what is left today (no lock taken, nothing reserved).

    Waiting calls poll with this rather than with try_reserve_daily, so they take no lock (on
    SQLite: no write lock that the engine's own writes and heartbeats would queue behind).
    """
    now = await db_now(session)
    day = now.astimezone(UTC).date()
    left, live = await _left_today(session, cap, day, now)
    return DailyCheck(day, None, left, live)


async def try_reserve_daily(session: AsyncSession, cap: Decimal, amount: Decimal, owner: str,
                            lease_s: float) -> DailyCheck:
    """Hold `amount` against today's cap if it fits, in the caller's transaction.

    The day's `daily_spend` row is the lock every process serialises on (Postgres: upsert, then
    SELECT ... FOR UPDATE; SQLite runs one process and its first write locks the database), so
    two processes can never both see the same money as free.
    """
    now = await db_now(session)
    day = now.astimezone(UTC).date()
    insert = postgresql.insert if _is_pg(session) else sqlite.insert
    await session.execute(insert(DailySpend).values(day=day, spent_usd=Decimal(0))
                          .on_conflict_do_nothing(index_elements=["day"]))
    if _is_pg(session):
        await session.execute(select(DailySpend.day).where(DailySpend.day == day)
                              .with_for_update())
    # expired rows belong to crashed processes: they no longer hold anything (same day only,
    # so two days' transactions around midnight never lock each other's rows)
    await session.execute(delete(DailyReservation).where(
        DailyReservation.day == day, DailyReservation.expires_at <= now))
    left, live = await _left_today(session, cap, day, now)
    if amount > left:
        return DailyCheck(day, None, left, live)
    rid = uuid.uuid4().hex
    session.add(DailyReservation(id=rid, day=day, owner=owner, amount=amount,
                                 expires_at=now + timedelta(seconds=lease_s)))
    await session.flush()
    return DailyCheck(day, rid, left, live)


async def settle_daily(session: AsyncSession, reservation_id: str, day: date,
                       actual: Decimal) -> None:
    """Replace a reservation by the real cost, added to the day it was reserved on."""
    # the day row first, then the reservation: the same lock order as try_reserve_daily
    if actual:
        await session.execute(update(DailySpend).where(DailySpend.day == day)
                              .values(spent_usd=DailySpend.spent_usd + actual))
    await session.execute(delete(DailyReservation).where(DailyReservation.id == reservation_id))


async def refresh_daily(session: AsyncSession, reservation_ids: Sequence[str],
                        lease_s: float) -> None:
    """Push the expiry of this process's live reservations one lease ahead."""
    if not reservation_ids:
        return
    now = await db_now(session)
    await session.execute(update(DailyReservation)
                          .where(DailyReservation.id.in_(list(reservation_ids)))
                          .values(expires_at=now + timedelta(seconds=lease_s)))


async def daily_spent(session: AsyncSession, day: date) -> Decimal:
    """Settled spend of one UTC day (0 when nothing was recorded)."""
    value = (await session.execute(
        select(DailySpend.spent_usd).where(DailySpend.day == day))).scalar_one_or_none()
    return value or Decimal(0)


# ---- the usage report -----------------------------------------------------------------------


@dataclass(frozen=True)
class UsageRow:
    key: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost_usd: Decimal
    gateway_calls: int


def _group_key(session: AsyncSession, group_by: GroupBy) -> ColumnElement[Any]:
    if group_by == "model":
        return GatewayCall.model.expression
    if group_by == "tenant":
        return GatewayCall.tenant.expression
    if _is_pg(session):
        # a literal, not a bind parameter: Postgres matches the GROUP BY expression textually
        return cast(func.timezone(literal_column("'UTC'"), GatewayCall.created_at), Date)
    return func.date(GatewayCall.created_at)  # SQLite keeps UTC text, "YYYY-MM-DD ..."


async def usage(session: AsyncSession, tenant: str, start: datetime | None,
                end: datetime | None, group_by: GroupBy) -> list[UsageRow]:
    """Tokens and exact spend of a tenant's ledger rows in [start, end), grouped and sorted."""
    key = _group_key(session, group_by)
    # SUM over Money stays Money: integer pico-dollars on SQLite, NUMERIC on Postgres, both exact
    q = (select(key, func.sum(GatewayCall.prompt_tokens), func.sum(GatewayCall.completion_tokens),
                func.sum(GatewayCall.cached_tokens), func.sum(GatewayCall.cost_usd), func.count())
         .where(GatewayCall.tenant == tenant).group_by(key).order_by(key))
    if start is not None:
        q = q.where(GatewayCall.created_at >= start)
    if end is not None:
        q = q.where(GatewayCall.created_at < end)
    rows = (await session.execute(q)).all()
    return [UsageRow(key=k.isoformat() if isinstance(k, date) else str(k),
                     prompt_tokens=int(p or 0), completion_tokens=int(c or 0),
                     cached_tokens=int(ca or 0), cost_usd=Decimal(cost or 0),
                     gateway_calls=int(n))
            for k, p, c, ca, cost, n in rows]
