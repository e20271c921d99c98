"""Tenant quotas in the database: the shared token bucket, per-tenant counts and every check of
a creation in its statement (the tenant daily cap's rows are `tenant_cap.py`'s).

Repository functions: they take a session and never commit; the caller owns the transaction.
On PostgreSQL the checks are also migration 0014's functions, sent as a statement of their own
(`admit_alone`) or inside a creation's (`Admit`): one round trip where the ORM took four or five.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Date,
    Executable,
    Float,
    ScalarSelect,
    bindparam,
    cast,
    func,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.db.base import table_of
from app.db.driver import fetchrow_pooled
from app.db.session import is_postgres
from app.db.tenant_cap import spent_of
from app.db.tenant_tables import TenantActive, TenantBucket
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
    # the trigger-kept counts (TenantActive): a few rows, however many swarms are active
    active = table_of(TenantActive).c
    return (select(func.coalesce(func.sum(active.active), 0))
            .where(active.tenant == tenant).scalar_subquery())


async def active_swarms(session: AsyncSession, tenant: str) -> int:
    """The tenant's swarms `max_active_swarms` counts (queued, awaiting approval, planning,
    running, synthesizing), as the triggers keep them."""
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
        columns.append(spent_of(tenant, day).scalar_subquery())
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
    statement (creation_statement.creation): each limit None when the tenant has none."""

    tenant: str
    size: float | None  # the bucket's size and refill per second (both or neither)
    rate: float | None
    max_active: int | None
    cap: Decimal | None

    CALL = "tenant_admit({}::varchar, {}::float8, {}::float8, {}::bigint, {}::numeric, " \
           "{}::varchar[], {}::varchar)"

    def args(self, own_id: str) -> tuple[Any, ...]:
        """The call's arguments, in CALL's order; `own_id`: the new swarm, never counted (the
        function reads the trigger-kept counts since migration 0024, which the new row's
        trigger changes only at the statement's end; the statuses and the id stay its
        arguments)."""
        return (self.tenant, self.size, self.rate, self.max_active, self.cap,
                list(ACTIVE_VALUES), own_id)


REFUSED_SQLSTATE = "SQ429"  # tenant_admit's refusal


# A statement holding the tenant's lock commits without waiting for its WAL flush: the lock is
# released at the commit, where the flush was a third of its holding (decision 0039)
ASYNC_COMMIT = "set_config('synchronous_commit', 'off', true) = 'off'"


async def admit_alone(engine: AsyncEngine, admit: Admit) -> None:
    """`tenant_admit` as a statement of its own (autocommit) for a request that stores
    nothing with its checks (the facade's): the token stays taken; `Refused` when a limit is
    reached. Its commit does not wait for its flush, and nothing waits for one after it: a
    database crash can only give the tenant back a token it took."""
    try:
        await fetchrow_pooled(engine, _ADMIT_ALONE, admit.args(""))
    except Exception as exc:
        if (refused := Refused.of(exc)) is not None:
            raise refused from None
        raise


_ADMIT_CALL = f"SELECT {Admit.CALL.format(*(f'${i}' for i in range(1, 8)))}"
_ADMIT_ALONE = f"{_ADMIT_CALL} AND {ASYNC_COMMIT}"


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
