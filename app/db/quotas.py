"""Tenant quotas in the database: the shared token bucket, per-tenant counts and the tenant
daily cap's rows (the same reserve / settle / refresh contract as `spend.py`'s global cap).

Repository functions: they take a session and never commit; the caller owns the transaction.
On PostgreSQL the checks and the cap's batches are also migration 0014's functions, sent as
statements of their own (`admit_alone`, `tenant_ops_statement`) or inside a creation's
(`Admit`): one round trip each where the ORM took four or five.
"""

from __future__ import annotations

import functools
import json
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Date,
    Executable,
    Float,
    ScalarSelect,
    Select,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.db.direct import fetchrow_pooled
from app.db.session import db_now, is_postgres
from app.db.spend import DailyCheck
from app.db.tables import (
    Swarm,
    TenantBucket,
    TenantDailyReservation,
    TenantDailySpend,
    table_of,
)
from app.db.types import utcnow
from app.states import COUNTED_SWARM

# max_active_swarms counts a swarm awaiting approval too (SPEC §8)
ACTIVE_VALUES = tuple(s.value for s in COUNTED_SWARM)


# ---- the token bucket -----------------------------------------------------------------------


@functools.cache
def _bucket_statements(pg: bool) -> tuple[Executable, Executable]:
    """The bucket's take (upsert) and look (its level now), built once per dialect with bound
    parameters `tenant`, `size`, `rate` (and `now` on SQLite): a `POST` spent ~0.2 ms of
    CPU building them afresh. The clock is the database's on PostgreSQL (replicas' clocks may
    differ), this process's on SQLite (one process)."""
    now: ColumnElement[Any] = (func.extract("epoch", func.now()) if pg
                               else bindparam("now", type_=Float()))
    size, rate = bindparam("size", type_=Float()), bindparam("rate", type_=Float())
    least, greatest = (func.least, func.greatest) if pg else (func.min, func.max)
    # the Core table, not the mapped class: an ORM entity's INSERT ... RETURNING goes through
    # the session's bulk-insert machinery (~8 % of `serve`'s samples with every quota checked)
    bucket = table_of(TenantBucket).c
    elapsed = greatest(now - bucket.updated_at, 0)
    refilled = least(bucket.tokens + elapsed * rate, size)
    upsert = postgresql.insert if pg else sqlite.insert
    take = (upsert(table_of(TenantBucket))
            .values(tenant=bindparam("tenant"), tokens=size - 1, updated_at=now)
            .on_conflict_do_update(index_elements=["tenant"],
                                   set_={"tokens": refilled - 1, "updated_at": now},
                                   where=refilled >= 1)
            .returning(bucket.tokens))
    look = select(refilled).where(bucket.tenant == bindparam("tenant"))
    return take, look


async def take_token(session: AsyncSession, tenant: str, size: float,
                     refill_per_s: float) -> float | None:
    """Take one token from the tenant's bucket in one atomic statement; None when taken, else
    the seconds until one will be there (nothing changes then).

    The row holds (tokens, updated_at); the upsert refills it for the time elapsed, capped at
    `size`, and takes a token only when at least one is there. Concurrent requests of one
    tenant serialise on the row, so replicas can never hand out the same token twice."""
    pg = is_postgres(session)
    take, look = _bucket_statements(pg)
    params: dict[str, Any] = {"tenant": tenant, "size": float(size), "rate": refill_per_s}
    if not pg:  # this process's clock (one process); PostgreSQL's own otherwise
        params["now"] = time.time()
    if (await session.execute(take, params)).first() is not None:
        return None
    row = (await session.execute(look, params)).one()
    return max((1 - float(row[0])) / refill_per_s, 0.001)


# ---- counts ---------------------------------------------------------------------------------


def _active_count(tenant: Any) -> ScalarSelect[int]:
    return select(func.count()).where(
        Swarm.tenant == tenant, Swarm.status.in_(ACTIVE_VALUES)).scalar_subquery()


async def active_swarms(session: AsyncSession, tenant: str) -> int:
    """The tenant's queued + planning + running + synthesizing swarms (an index range scan
    over its own rows only)."""
    return int((await session.execute(select(_active_count(tenant)))).scalar_one())


# The lock a count of a tenant's active swarms holds to its transaction's end (PostgreSQL),
# so the next count sees the swarms this one's transaction inserted: the tenant's bucket row
# (what `take_token` locks: POST /swarms of a tenant with a bucket holds it already), else a
# transaction advisory lock of the tenant's own.
_LOCK_BUCKET = (select(TenantBucket.tenant).where(TenantBucket.tenant == bindparam("tenant"))
                .with_for_update())
_LOCK_ACTIVE = text("SELECT pg_advisory_xact_lock(hashtext('swarm-active:' || :tenant))")


async def lock_active(session: AsyncSession, tenant: str, *, bucket: bool) -> None:
    """Serialise the tenant's active-swarm counts until the caller's transaction ends: its
    bucket's row (`bucket`: the tenant has one; the lock `take_token` takes, so counts with
    and without a token wait for each other), else (or with no row yet) the tenant's advisory
    lock. Nothing on SQLite: BEGIN IMMEDIATE already serialises every writer."""
    if not is_postgres(session):
        return
    params = {"tenant": tenant}
    if bucket and (await session.execute(_LOCK_BUCKET, params)).first() is not None:
        return
    await session.execute(_LOCK_ACTIVE, params)


@dataclass(frozen=True, slots=True)
class TenantNow:
    """What admission checks after the tenant's token, read in one statement."""

    now: datetime  # the database's clock (PostgreSQL; this process's on SQLite)
    active: int  # the tenant's active swarms (0 unless asked)
    spent: Decimal  # the tenant's settled spend today, UTC (0 unless asked)


@functools.cache
def _now_statement(pg: bool, count: bool, spent: bool) -> Executable:
    tenant: BindParameter[str] = bindparam("tenant")
    day: ColumnElement[Any] = (cast(func.timezone("UTC", func.now()), Date) if pg
                               else bindparam("day", type_=Date()))
    columns: list[Any] = [func.now()] if pg else []
    if count:
        columns.append(_active_count(tenant))
    if spent:
        columns.append(_spent_of(tenant, day).scalar_subquery())
    return select(*columns)


async def tenant_now(session: AsyncSession, tenant: str, *, count: bool,
                     spent: bool) -> TenantNow:
    """The clock, the tenant's active swarms (`count`) and today's settled spend (`spent`):
    one statement where they were three round trips. At least one of the two is asked."""
    assert count or spent
    pg = is_postgres(session)
    now = None if pg else utcnow()
    params: dict[str, Any] = {"tenant": tenant}
    if now is not None:
        params["day"] = now.astimezone(UTC).date()
    row = list((await session.execute(_now_statement(pg, count, spent), params)).one())
    if now is None:
        now = row.pop(0)
    active = int(row.pop(0)) if count else 0
    settled = (row.pop(0) if spent else None) or Decimal(0)
    return TenantNow(now, active, settled)


# ---- every check of a creation in its statement (PostgreSQL) ---------------------------------


@dataclass(frozen=True, slots=True)
class Admit:
    """A creation's quota checks for migration 0014's `tenant_admit`, called in the creation's
    statement (one_statement.creation): each limit None when the tenant has none."""

    tenant: str
    size: float | None  # the bucket's size and refill per second (both or neither)
    rate: float | None
    max_active: int | None
    cap: Decimal | None

    CALL = "tenant_admit({}::varchar, {}::float8, {}::float8, {}::bigint, {}::numeric, " \
           "{}::varchar[], {}::varchar)"

    def args(self, own_id: str) -> tuple[Any, ...]:
        """The call's arguments, in CALL's order; `own_id`: the new swarm, never counted."""
        return (self.tenant, self.size, self.rate, self.max_active, self.cap,
                list(ACTIVE_VALUES), own_id)


REFUSED_SQLSTATE = "SQ429"  # tenant_admit's refusal


async def admit_alone(engine: AsyncEngine, admit: Admit) -> None:
    """`tenant_admit` as a statement of its own (autocommit) for a request that stores
    nothing with its checks (the facade's): the token stays taken; `Refused` when a limit is
    reached."""
    try:
        await fetchrow_pooled(engine, f"SELECT {Admit.CALL.format(*_DOLLARS)}",
                              admit.args(""))
    except Exception as exc:
        if (refused := Refused.of(exc)) is not None:
            raise refused from None
        raise


_DOLLARS = tuple(f"${i}" for i in range(1, 8))


class Refused(Exception):
    """`tenant_admit` refused the creation: `limit` is the SPEC §8 key; `wait_s` (the bucket),
    `active` (max_active_swarms) or `spent` (the daily cap) says by how much; `now` is the
    database's clock."""

    def __init__(self, limit: str, now: datetime, wait_s: float = 0.0, active: int = 0,
                 spent: Decimal = Decimal(0)) -> None:
        super().__init__(limit)
        self.limit, self.now, self.wait_s, self.active, self.spent = (
            limit, now, wait_s, active, spent)

    @classmethod
    def of(cls, exc: BaseException) -> Refused | None:
        """The refusal an error of the creation's statement carries (None: another error)."""
        if getattr(exc, "sqlstate", None) != REFUSED_SQLSTATE:
            return None
        detail = json.loads(getattr(exc, "detail", None) or "{}")
        return cls(str(getattr(exc, "message", "")),
                   datetime.fromtimestamp(float(detail["now"]), UTC),
                   wait_s=float(detail.get("wait", 0.0)), active=int(detail.get("active", 0)),
                   spent=Decimal(detail.get("spent") or 0))


# ---- the tenant daily cap -------------------------------------------------------------------


def _spent_of(tenant: Any, day: Any) -> Select[Decimal]:
    return select(TenantDailySpend.spent_usd).where(
        TenantDailySpend.tenant == tenant, TenantDailySpend.day == day)


async def tenant_spent(session: AsyncSession, tenant: str, day: date) -> Decimal:
    """Settled spend of a tenant on one UTC day."""
    value = (await session.execute(_spent_of(tenant, day))).scalar_one_or_none()
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
# committed). It was a transaction of up to five round trips through the ORM, twice for every
# call of a tenant with a cap (every tenant by default): most of `serve`'s CPU per 1-agent swarm
# beside the service's own (bench/RESULTS.md, session 26).
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
