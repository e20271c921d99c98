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

from sqlalchemy import (
    ColumnElement,
    Date,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal_column,
    select,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import table_of
from app.db.session import db_now, is_postgres
from app.db.tables import DailyReservation, DailySpend, GatewayCall, Subtask, Swarm
from app.db.tenant_tables import TenantDailyReservation
from app.db.types import Money
from app.db.writes import lock_leases
from app.schemas import GroupBy
from app.states import NOT_BILLED, AttemptOutcome

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
    """What is left of the day's cap, and how many reservations are live. Every reservation
    of the day holds its amount, an expired one too: its process died (or stalled) with the
    call it covered possibly sent and billed; only its owner's settlement frees it. (Freed at
    its expiry, it let another process spend the whole cap before a takeover counted the
    dead call: real spend past the cap.) Only live ones may free money soon."""
    spent = (await session.execute(
        select(DailySpend.spent_usd).where(DailySpend.day == day))).scalar_one_or_none()
    held, live = (await session.execute(
        select(func.sum(DailyReservation.amount),
               func.count(case((DailyReservation.expires_at > now, 1))))
        .where(DailyReservation.day == day))).one()
    return cap - (spent or Decimal(0)) - (held or Decimal(0)), int(live or 0)


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
    insert = postgresql.insert if is_postgres(session) else sqlite.insert
    await session.execute(insert(DailySpend).values(day=day, spent_usd=Decimal(0))
                          .on_conflict_do_nothing(index_elements=["day"]))
    if is_postgres(session):
        await session.execute(select(DailySpend.day).where(DailySpend.day == day)
                              .with_for_update())
    # a dead process's reservations hold their day's money (_left_today) for that day only:
    # rows two days old hold nothing any more (not yesterday's: two days' transactions
    # around midnight never lock each other's rows)
    await session.execute(delete(DailyReservation).where(
        DailyReservation.day < day - timedelta(days=1)))
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


async def refresh_owned(session: AsyncSession, owner: str, reservation_ids: list[str],
                        lease_s: float) -> None:
    """Push the daily-cap reservations this process's caps hold (global and tenants') one
    lease ahead, with its swarm leases (the heartbeat's transaction): a reservation stays live
    while its owner holds its leases, a stall of the refreshers notwithstanding. Only those
    held: a row none holds (its reserve cut off) kept live would keep a call that cannot fit
    beside it waiting for as long as the waiting swarm's own lease is extended."""
    if not reservation_ids:
        return
    until = await db_now(session) + timedelta(seconds=lease_s)
    for table in (DailyReservation, TenantDailyReservation):
        await session.execute(update(table).where(table.owner == owner,
                                                  table.id.in_(reservation_ids))
                              .values(expires_at=until))


# ---- attempts a crash left unsettled --------------------------------------------------------


@dataclass(frozen=True)
class LostAttempt:
    """An attempt written ahead by an owner that died before its answer was committed: now
    `unknown`, billed at its reservation (prompt-token bound, completion at max_tokens)."""

    subtask_name: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: Decimal


@dataclass(frozen=True)
class Takeover:
    lost: list[LostAttempt]
    attempts: dict[str, int]  # subtask -> the highest attempt number in its ledger rows


async def settle_lost_attempts(session: AsyncSession, swarm_id: str, epoch: int, owner: str,
                               lease_s: float | None = None) -> Takeover | None:
    """At a takeover: settle the dead epochs' `in_flight` rows of the swarm as `unknown`,
    each at its reservation, and add them to the swarm's and subtasks' totals, in one
    transaction with the lease checked (None: fenced out). The daily caps hold them already:
    each attempt's reservation outlives its dead owner (`_left_today`).

    A gateway may have billed those attempts, so recorded spend stays an upper bound on real
    spend and every cap holds in real money. Also returns each subtask's highest attempt
    number, so a re-sent attempt takes a new ledger key."""
    held = await lock_leases(session, [swarm_id], lease_s)
    if held.get(swarm_id) != (epoch, owner):
        return None
    return await settle_in_flight(session, swarm_id)


_IN_FLIGHT = GatewayCall.outcome == AttemptOutcome.in_flight


async def settle_in_flight(session: AsyncSession, swarm_id: str) -> Takeover:
    """`settle_lost_attempts` without the lease: for the caller that ends a swarm whose owner
    lapsed (a cancel of a queued swarm, which may hold the calls its creation wrote ahead:
    `create.Ahead`), in its transaction."""
    rows = (await session.execute(
        select(GatewayCall.subtask_name, GatewayCall.model, GatewayCall.prompt_tokens,
               GatewayCall.completion_tokens, GatewayCall.reserved_usd)
        .where(GatewayCall.swarm_id == swarm_id, _IN_FLIGHT))).all()
    attempts = {str(name): int(n) for name, n in (await session.execute(
        select(GatewayCall.subtask_name, func.max(GatewayCall.attempt))
        .where(GatewayCall.swarm_id == swarm_id).group_by(GatewayCall.subtask_name))).all()}
    lost = [LostAttempt(str(name), model, p, c, reserved)
            for name, model, p, c, reserved in rows]
    if lost:
        await session.execute(
            update(GatewayCall)
            .where(GatewayCall.swarm_id == swarm_id, _IN_FLIGHT)
            .values(outcome=AttemptOutcome.unknown, cost_usd=GatewayCall.reserved_usd,
                    at_bound=True))
        total = sum((a.cost_usd for a in lost), Decimal(0))
        await session.execute(update(Swarm).where(Swarm.id == swarm_id).values(
            spent_usd=Swarm.spent_usd + total, unresolved_usd=Swarm.unresolved_usd + total,
            prompt_tokens=Swarm.prompt_tokens + sum(a.prompt_tokens for a in lost),
            completion_tokens=Swarm.completion_tokens + sum(a.completion_tokens for a in lost),
            gateway_calls=Swarm.gateway_calls + len(lost)))
        per_sub: dict[str, list[LostAttempt]] = {}
        for a in lost:
            per_sub.setdefault(a.subtask_name, []).append(a)
        for name, items in per_sub.items():
            await session.execute(update(Subtask).where(
                Subtask.swarm_id == swarm_id, Subtask.name == name).values(
                cost_usd=Subtask.cost_usd + sum((a.cost_usd for a in items), Decimal(0)),
                prompt_tokens=Subtask.prompt_tokens + sum(a.prompt_tokens for a in items),
                completion_tokens=Subtask.completion_tokens
                + sum(a.completion_tokens for a in items)))
    if attempts:  # written-ahead attempts were counted only in the dead owner's memory
        subs = table_of(Subtask)
        conn = await session.connection()
        await conn.execute(
            update(subs)
            .where(subs.c.swarm_id == swarm_id, subs.c.name == bindparam("name_"),
                   subs.c.attempts < bindparam("n_"))
            .values(attempts=bindparam("n_")),
            [{"name_": k, "n_": v} for k, v in attempts.items()])
    return Takeover(lost, attempts)


# ---- the usage report -----------------------------------------------------------------------


@dataclass(frozen=True)
class UsageRow:
    key: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost_usd: Decimal
    gateway_calls: int
    unresolved_usd: Decimal = Decimal(0)  # the part of cost_usd billed at an upper bound


# rows that are no gateway call (yet): written ahead and not settled, or never sent


def _group_key(session: AsyncSession, group_by: GroupBy) -> ColumnElement[Any]:
    if group_by == "model":
        return GatewayCall.model.expression
    if group_by == "tenant":
        return GatewayCall.tenant.expression
    if is_postgres(session):
        # a literal, not a bind parameter: Postgres matches the GROUP BY expression textually
        return cast(func.timezone(literal_column("'UTC'"), GatewayCall.created_at), Date)
    return func.date(GatewayCall.created_at)  # SQLite keeps UTC text, "YYYY-MM-DD ..."


async def usage(session: AsyncSession, tenant: str, start: datetime | None,
                end: datetime | None, group_by: GroupBy) -> list[UsageRow]:
    """Tokens and exact spend of a tenant's ledger rows in [start, end), grouped and sorted."""
    key = _group_key(session, group_by)
    # SUM over Money stays Money: integer pico-dollars on SQLite, NUMERIC on Postgres, both exact
    unresolved = type_coerce(func.sum(case((GatewayCall.at_bound, GatewayCall.cost_usd))),
                             Money)
    q = (select(key, func.sum(GatewayCall.prompt_tokens), func.sum(GatewayCall.completion_tokens),
                func.sum(GatewayCall.cached_tokens), func.sum(GatewayCall.cost_usd), func.count(),
                unresolved)
         .where(GatewayCall.tenant == tenant, GatewayCall.outcome.not_in(NOT_BILLED))
         .group_by(key).order_by(key))
    if start is not None:
        q = q.where(GatewayCall.created_at >= start)
    if end is not None:
        q = q.where(GatewayCall.created_at < end)
    rows = (await session.execute(q)).all()
    return [UsageRow(key=k.isoformat() if isinstance(k, date) else str(k),
                     prompt_tokens=int(p or 0), completion_tokens=int(c or 0),
                     cached_tokens=int(ca or 0), cost_usd=Decimal(cost or 0),
                     gateway_calls=int(n), unresolved_usd=Decimal(lost or 0))
            for k, p, c, ca, cost, n, lost in rows]
