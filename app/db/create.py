"""Creating a swarm: its rows (Core inserts; on PostgreSQL the swarm row, its NOTIFY and its
queue position in one statement) and the Idempotency-Key lookups. The caller owns the
transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import (
    Float,
    String,
    Table,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql import Executable

from app.db.batch import executemany
from app.db.notify import QUEUED
from app.db.one_statement import insert_rows
from app.db.queries import queue_position
from app.db.session import db_now
from app.db.session import is_postgres as _is_pg
from app.db.tables import (
    Subtask,
    Swarm,
    column_values,
)
from app.db.types import utcnow
from app.states import SwarmStatus

SUBTASK_INSERT_COLUMNS = (
    "swarm_id", "name", "position", "kind", "model", "depends_on", "system_prompt", "prompt",
    "max_tokens", "temperature", "weight", "status", "attempts", "output", "error", "truncated",
    "prompt_tokens", "completion_tokens", "cost_usd", "latency_ms", "ready_at", "started_at",
    "finished_at", "reused", "tools", "max_turns", "turns", "tool_calls",
    "sanitized",
)


def insert_row(sub: Subtask) -> dict[str, Any]:
    """Every column of a new subtask, for Core executemany inserts (instrumented getattrs
    were 15 % of creating a 1,000-agent swarm)."""
    return column_values(sub, SUBTASK_INSERT_COLUMNS)


_SWARMS = cast(Table, Swarm.__table__)
_SUBTASKS = cast(Table, Subtask.__table__)
_SUBTASK_INSERT = insert(_SUBTASKS)
# (attribute, column key) of every mapped column of a swarm row
_SWARM_COLUMNS = tuple((p.key, p.columns[0].key) for p in sa_inspect(Swarm).column_attrs)
_LEASED = ("lease_owner", "lease_epoch", "lease_expires_at")


def _swarm_values(swarm: Swarm) -> dict[str, Any]:
    """Every column of a new swarm: its attributes, else the column's default (else NULL)."""
    state = swarm.__dict__
    values: dict[str, Any] = {}
    for attr, col in _SWARM_COLUMNS:
        if attr in state:
            values[col] = state[attr]
        else:
            default: Any = _SWARMS.c[col].default
            values[col] = (None if default is None else default.arg if default.is_scalar
                           else default.arg(None))
    return values


_PG_INSERTS: dict[tuple[bool, bool], Executable] = {}


def _pg_insert_swarm(claim: bool, count: bool) -> Executable:
    """One statement: the swarm's row (leased with `claim`: lease from the database's clock,
    `:lease_s` ahead), its NOTIFY, and with `count` the tenant's queued swarms older than it
    (the statement's snapshot: the new row is not counted). Built once per shape, with bind
    parameters only, so SQLAlchemy's compiled cache serves every request."""
    key = (claim, count)
    if key not in _PG_INSERTS:
        cols: dict[str, Any] = {c: bindparam(c, type_=_SWARMS.c[c].type)
                                for _, c in _SWARM_COLUMNS}
        if claim:
            cols["lease_expires_at"] = func.now() + func.make_interval(
                0, 0, 0, 0, 0, 0, bindparam("lease_s", type_=Float()))
        new = (pg_insert(_SWARMS).values(cols)
               .returning(_SWARMS.c.lease_expires_at).cte("new_swarm"))
        # a swarm leased to the creating process is nobody else's to claim: no wake-up for
        # every engine (each would run its claim query for nothing)
        out: list[Any] = [new.c.lease_expires_at] if claim else [
            new.c.lease_expires_at, func.pg_notify(QUEUED, bindparam("id_", type_=String()))]
        if count:
            out.append(select(func.count()).where(
                _SWARMS.c.tenant == bindparam("tenant"),
                _SWARMS.c.status == SwarmStatus.queued.value,
                _SWARMS.c.created_at < bindparam("created_at")).scalar_subquery())
        _PG_INSERTS[key] = select(*out).select_from(new)
    return _PG_INSERTS[key]


async def insert_swarm(session: AsyncSession, swarm: Swarm, subtasks: Sequence[Subtask], *,
                       claim_for: str | None = None, lease_s: float = 0.0,
                       position: bool = False) -> int | None:
    """Insert a queued swarm and its subtasks, and wake the workers (on commit) unless it is
    claimed for the caller's engine.

    Core statements, no unit of work: on PostgreSQL the swarm's row, its NOTIFY and (with
    `position`) its queue position are one statement, the subtasks a second. `claim_for`
    leases the new swarm to that engine in the same statement (`claim_new`'s epoch 1, its
    lease from the database's clock), and its queue position is then 1: it starts now, no
    swarm of its tenant's queue ahead of it. Returns the queue position when asked."""
    if claim_for is not None:
        swarm.lease_owner, swarm.lease_epoch = claim_for, 1
    values = _swarm_values(swarm)
    count = position and claim_for is None
    found: int | None = 1 if position else None
    if _is_pg(session):
        stmt = _pg_insert_swarm(claim_for is not None, count)
        params = {**values, "id_": swarm.id}
        if claim_for is not None:
            del params["lease_expires_at"]
            params["lease_s"] = float(lease_s)
        row = (await session.execute(stmt, params)).one()
        swarm.lease_expires_at = row[0]
        if count:
            found = int(row[-1]) + 1  # the count is last
    else:
        if claim_for is not None:
            values["lease_expires_at"] = utcnow() + timedelta(seconds=lease_s)
            swarm.lease_expires_at = values["lease_expires_at"]
        await session.execute(insert(_SWARMS), values)
        if count:
            found = await queue_position(session, swarm)
    if subtasks:  # Core, not ORM objects: a hundred of them cost a unit of work each
        rows = [insert_row(s) for s in subtasks]
        conn = await session.connection()
        if _is_pg(session):  # one statement, not one per row
            await insert_rows(conn, _SUBTASKS, rows)
        else:
            await executemany(conn, _SUBTASK_INSERT, rows)
    return found


async def expire_idempotency_key(session: AsyncSession, tenant: str, key: str,
                                 ttl_s: float) -> None:
    """Free a key older than its TTL so it can name a new swarm (the old swarm keeps its data)."""
    cutoff = await db_now(session) - timedelta(seconds=ttl_s)
    await session.execute(
        update(Swarm)
        .where(Swarm.tenant == tenant, Swarm.idempotency_key == key, Swarm.created_at < cutoff)
        .values(idempotency_key=None, request_hash=None)
    )


async def find_by_idempotency_key(session: AsyncSession, tenant: str, key: str,
                                  ttl_s: float) -> Swarm | None:
    """The swarm a live (not yet expired) Idempotency-Key names."""
    cutoff = await db_now(session) - timedelta(seconds=ttl_s)
    stmt = select(Swarm).where(Swarm.tenant == tenant, Swarm.idempotency_key == key,
                               Swarm.created_at >= cutoff)
    return (await session.execute(stmt)).scalar_one_or_none()
