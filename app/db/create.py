"""Creating a swarm: its rows (on PostgreSQL the swarm's row, its subtasks, its NOTIFY and its
queue position in one statement) and the Idempotency-Key lookups. The caller owns the
transaction, or (`insert_swarm_alone`) the statement is one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import asyncpg
from sqlalchemy import Table, insert, select, update
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.db import creation_statement, durable
from app.db.base import column_values
from app.db.batch import executemany
from app.db.columns import SUBTASK_INSERT_COLUMNS
from app.db.dialect import engine_of
from app.db.driver import fetchrow_pooled
from app.db.live_rows import LiveSubtask
from app.db.queries import queued_swarms
from app.db.quotas import Admit, Refused
from app.db.session import db_now
from app.db.session import is_postgres as _is_pg
from app.db.spend import DailyCheck
from app.db.tables import GatewayCall, Subtask, Swarm
from app.db.tenant_cap import CapAsk, tenant_checks
from app.db.types import utcnow


@dataclass
class Ahead:
    """Calls written ahead with a swarm's creation (the first wave of a swarm claimed as it is
    created, `SwarmRunner.first_wave`): their `gateway_calls` rows, in flight; with `cap`, the
    reservations against the tenant's daily cap they need, asked in the same transaction (one
    per row, in order). `checks` is the cap's answer once stored: a row whose reservation
    did not fit was not written."""

    rows: list[dict[str, Any]]
    cap: CapAsk | None = None
    checks: list[DailyCheck] | None = None

    def granted(self, checks: list[DailyCheck]) -> list[dict[str, Any]]:
        """Keep the cap's answer; the rows it let through."""
        self.checks = checks
        return [row for row, check in zip(self.rows, checks, strict=True)
                if check.reservation_id is not None]


def insert_row(sub: Subtask) -> dict[str, Any]:
    """Every column of a new subtask, for Core executemany inserts (not through instrumented
    getattrs: docs/decisions/0011-live-rows.md)."""
    return column_values(sub, SUBTASK_INSERT_COLUMNS)


_SWARMS = cast(Table, Swarm.__table__)
_SUBTASKS = cast(Table, Subtask.__table__)
_SUBTASK_INSERT = insert(_SUBTASKS)
_LEDGER_INSERT = insert(cast(Table, GatewayCall.__table__))
# (attribute, column key) of every mapped column of a swarm row
_SWARM_COLUMNS = tuple((p.key, p.columns[0].key) for p in sa_inspect(Swarm).column_attrs)


def _swarm_values(swarm: Swarm) -> dict[str, Any]:
    """Every column of a new swarm, by column name: a live row (`specs.new_swarm_row`) holds
    each in its instance dict."""
    state = swarm.__dict__
    return {col: state[attr] for attr, col in _SWARM_COLUMNS}


async def insert_swarm(session: AsyncSession, swarm: Swarm, subtasks: Sequence[Subtask], *,
                       claim_for: str | None = None, lease_s: float = 0.0,
                       position: bool = False, ahead: Ahead | None = None) -> int | None:
    """Insert a queued swarm and its subtasks (and the calls it writes `ahead`) in the
    session's transaction, and wake the workers (on commit) unless it is claimed for the
    caller's engine.

    Core statements, no unit of work: on PostgreSQL the swarm's row, its subtasks, its NOTIFY
    and (with `position`) its queue position are one statement (`creation_statement.creation`).
    `claim_for` leases the new swarm to that engine in the same statement (`claim_new`'s epoch
    1, its lease from the database's clock), and its queue position is then 1: it starts now,
    no swarm of its tenant's queue ahead of it. Returns the queue position when asked."""
    if _is_pg(session):
        sql, args = _creation(swarm, subtasks, claim_for, lease_s, position, ahead=ahead)
        conn = await session.connection()
        row = (await conn.exec_driver_sql(sql, args)).one()
        return _created(swarm, row, claim_for, position, ahead)
    if claim_for is not None:
        swarm.lease_owner, swarm.lease_epoch = claim_for, 1
        swarm.lease_expires_at = utcnow() + timedelta(seconds=lease_s)
    await session.execute(insert(_SWARMS), _swarm_values(swarm))
    found = 1 if position else None
    if position and claim_for is None:  # its own row's trigger has counted it
        found = await queued_swarms(session, swarm.tenant)
    if subtasks:  # Core, not ORM objects: a hundred of them cost a unit of work each
        await executemany(await session.connection(), _SUBTASK_INSERT,
                          [insert_row(s) for s in subtasks])
    if ahead is not None and ahead.rows:
        rows = ahead.rows if ahead.cap is None else ahead.granted(await ahead.cap.apply(session))
        if rows:
            await executemany(await session.connection(), _LEDGER_INSERT, rows)
    return found


class KeyTaken(Exception):
    """A concurrent request with the same Idempotency-Key inserted its swarm first."""


_KEY_CONSTRAINT = "uq_swarms_tenant_idempotency_key"


async def insert_swarm_alone(engine: AsyncEngine, swarm: Swarm, subtasks: Sequence[Subtask], *,
                             claim_for: str | None = None, lease_s: float = 0.0,
                             position: bool = False, admit: Admit | None = None,
                             key_ttl_s: float | None = None,
                             ahead: Ahead | None = None,
                             audit: Sequence[str | None] | None = None) -> int | None:
    """`insert_swarm` on PostgreSQL as a transaction of its own: its one statement in
    autocommit, sent by the pooled connection's driver (no BEGIN, no COMMIT, none of
    SQLAlchemy's execution around it). For a creation nothing else is written with (no
    Idempotency-Key, no quota to check in its transaction): one round trip where a
    transaction takes four (docs/decisions/0002-group-commit-one-statement.md).
    With `admit`, the tenant's quotas are checked in that statement: `Refused` when one is
    reached (nothing stored); it commits without waiting for its flush, and returns once a
    flush shared with concurrent creations covers it (`durable`). With `key_ttl_s` (the swarm
    carries an Idempotency-Key), an expired holder of its key lets go of it in that statement
    too: `KeyTaken` when a live one (a concurrent request's) has it. `ahead` as
    `insert_swarm`'s; `audit`: the creation's audit row's values (`audit.statement_values`),
    written by the statement."""
    sql, args = _creation(swarm, subtasks, claim_for, lease_s, position, admit, key_ttl_s,
                          ahead, audit)
    try:
        row = await fetchrow_pooled(engine, sql, args)
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name == _KEY_CONSTRAINT:
            raise KeyTaken(swarm.idempotency_key) from None
        raise
    except asyncpg.PostgresError as exc:
        if (refused := Refused.of(exc)) is not None:
            raise refused from None
        raise
    assert row is not None  # the statement answers one row
    if admit is not None:  # it committed without its flush, to free the tenant's lock sooner
        await durable.flushed(engine)
    return _created(swarm, row, claim_for, position, ahead)


def _creation(swarm: Swarm, subtasks: Sequence[Subtask], claim_for: str | None,
              lease_s: float, position: bool, admit: Admit | None = None,
              key_ttl_s: float | None = None, ahead: Ahead | None = None,
              audit: Sequence[str | None] | None = None) -> tuple[str, tuple[Any, ...]]:
    if claim_for is not None:
        swarm.lease_owner, swarm.lease_epoch = claim_for, 1
    return creation_statement.creation(
        # a new subtask's instance dict holds its columns: read as it is (no copy per row); a
        # loaded row's is copied
        _swarm_values(swarm), [s.__dict__ if isinstance(s, LiveSubtask) else insert_row(s)
                               for s in subtasks], SUBTASK_INSERT_COLUMNS,
        claim_s=lease_s if claim_for is not None else None,
        count=position and claim_for is None, admit=admit, key_ttl_s=key_ttl_s,
        ledger=ahead.rows if ahead is not None else (),
        cap=ahead.cap if ahead is not None else None, audit=audit)


def _created(swarm: Swarm, row: Sequence[Any], claim_for: str | None, position: bool,
             ahead: Ahead | None = None) -> int | None:
    """The creation statement's answer: the lease's expiry (database clock), the cap's answer
    for the calls written ahead, the position."""
    if ahead is not None and ahead.cap is not None and ahead.rows:
        ahead.granted(tenant_checks(row[1:5]))
    expires: datetime | None = row[0]
    swarm.lease_expires_at = expires.astimezone(UTC) if expires is not None else None
    if not position:
        return None
    return 1 if claim_for is not None else int(row[-1]) + 1  # the count is last


async def expire_idempotency_key(session: AsyncSession, tenant: str, key: str,
                                 ttl_s: float) -> None:
    """Free a key older than its TTL so it can name a new swarm (the old swarm keeps its data)."""
    cutoff = await db_now(session) - timedelta(seconds=ttl_s)
    await session.execute(
        update(Swarm)
        .where(Swarm.tenant == tenant, Swarm.idempotency_key == key, Swarm.created_at < cutoff)
        .values(idempotency_key=None, request_hash=None)
    )


_KEY_HOLDER = ("SELECT id, request_hash FROM swarms WHERE tenant = $1 AND idempotency_key = $2 "
               "AND created_at >= now() - make_interval(secs => $3::float8)")


async def key_holder(session: AsyncSession, tenant: str, key: str, ttl_s: float
                     ) -> tuple[str, str | None] | None:
    """The id and request hash of the swarm a live (not yet expired) Idempotency-Key names,
    or None (the key is free). PostgreSQL: one statement alone, the database's clock in it
    (in the session's transaction it was BEGIN, `SELECT now()`, the select, COMMIT)."""
    if _is_pg(session):
        row = await fetchrow_pooled(engine_of(session), _KEY_HOLDER,
                                    (tenant, key, float(ttl_s)))
        return None if row is None else (row[0], row[1])
    async with session.begin():
        cutoff = await db_now(session) - timedelta(seconds=ttl_s)
        found = (await session.execute(
            select(Swarm.id, Swarm.request_hash).where(
                Swarm.tenant == tenant, Swarm.idempotency_key == key,
                Swarm.created_at >= cutoff))).first()
    return None if found is None else (found[0], found[1])
