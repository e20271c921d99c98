"""The group commit on SQLite: many runners' writes in one transaction, fenced by lease epoch;
ledger rows settled by (idempotency_key, attempt) (the tenant cap settlements the writes carry:
`batches`, in the same transaction). Also the salvage of a refused write's money."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import (
    Table,
    Update,
    bindparam,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.sql import Executable, Insert

from app.db.batch import executemany
from app.db.changes import SwarmWrite
from app.db.columns import (
    LEDGER_SETTLED,
    SUBTASK_STATE_COLUMNS,
    SWARM_STATE_COLUMNS,
    SWARM_TOTAL_COLUMNS,
)
from app.db.leases import idle_limit as _idle_limit
from app.db.session import is_postgres as _is_pg
from app.db.tables import Event, GatewayCall, Subtask, Swarm, ToolCall, TranscriptMessage, Webhook
from app.states import AttemptOutcome


async def lock_leases(session: AsyncSession, swarm_ids: Sequence[str],
                      lease_s: float | None = None) -> dict[str, tuple[int, str | None]]:
    """Lock the swarms' rows (`SELECT … FOR UPDATE`: holds off a concurrent claim until this
    transaction ends) and return {id: (lease_epoch, lease_owner)}. With `lease_s`, a pause of
    this process inside the transaction cannot hold the rows locked for longer."""
    lock = (
        select(Swarm.id, Swarm.lease_epoch, Swarm.lease_owner)
        .where(Swarm.id.in_(list(swarm_ids)))
        .with_for_update()
    )
    if lease_s is not None and _is_pg(session):
        lock = lock.add_columns(_idle_limit(lease_s))  # in the same round trip as the lock
    # through the connection: a Core select needs none of the ORM's result handling (measured)
    conn = await session.connection()
    return {r[0]: (r[1], r[2]) for r in await conn.execute(lock)}


async def apply_writes(session: AsyncSession, owner: str, writes: Sequence[SwarmWrite],
                       lease_s: float | None = None) -> set[str]:
    """Write many runners' changes in one transaction, statement by statement; returns the
    swarm ids fenced out (another process holds their lease now), whose writes were dropped.
    The group commit on SQLite (its readers in this process are told by the writer's
    on_commit); PostgreSQL's runs them as one statement in autocommit
    (app/db/commit_statement.py, which also NOTIFYs)."""
    held = await lock_leases(session, list({w.swarm_id for w in writes}), lease_s)
    ok = [w for w in writes if held.get(w.swarm_id) == (w.epoch, owner)]
    fenced = {w.swarm_id for w in writes} - {w.swarm_id for w in ok}
    if not ok:
        return fenced
    latest: dict[str, dict[str, Any]] = {}
    inserts: list[dict[str, Any]] = []
    hooks: list[dict[str, Any]] = []
    subtasks: list[dict[str, Any]] = []
    ledger: dict[tuple[str, int], dict[str, Any]] = {}
    events: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    transcript: list[dict[str, Any]] = []
    for w in ok:
        latest[w.swarm_id] = {"id_": w.swarm_id, **w.swarm}
        inserts.extend(w.new_subtasks)
        if w.webhook is not None:
            hooks.append(w.webhook)
        subtasks.extend({"swarm_id_": w.swarm_id, **row} for row in w.subtasks)
        for row in w.ledger:  # an attempt written ahead and settled in one batch: one row
            ledger[(row["idempotency_key"], row["attempt"])] = row
        events.extend(w.events)
        tool_calls.extend(w.tool_calls)
        transcript.extend(w.transcript)
    # (app/db/batch.py: the ORM's bulk paths and even Core's cost several times more per row)
    conn = await session.connection()
    await executemany(conn, _SWARM_UPDATE, list(latest.values()))
    if inserts:
        await executemany(conn, _ignoring_duplicates(conn, _SUBTASK_INSERT), inserts)
    if subtasks:
        await executemany(conn, _SUBTASK_UPDATE, subtasks)
    if ledger:
        await executemany(conn, settling_insert(conn), list(ledger.values()))
    if events:
        await executemany(conn, _ignoring_duplicates(conn, _EVENT_INSERT), events)
    if hooks:
        await executemany(conn, _ignoring_duplicates(conn, _WEBHOOK_INSERT), hooks)
    if tool_calls:
        await executemany(conn, _ignoring_duplicates(conn, _TOOL_CALL_INSERT), tool_calls)
    if transcript:
        await executemany(conn, _ignoring_duplicates(conn, _TRANSCRIPT_INSERT), transcript)
    return fenced


async def apply_spend_only(session: AsyncSession, owner: str, write: SwarmWrite,
                           lease_s: float | None = None) -> bool:
    """The money of a write that cannot be stored whole (its text is refused): only its
    ledger rows and the swarm's totals, which hold nothing but our own names and numbers
    (its tenant cap settlements: `batches.spend_only`). False when fenced out."""
    held = await lock_leases(session, [write.swarm_id], lease_s)
    if held.get(write.swarm_id) != (write.epoch, owner):
        return False
    await session.execute(update(Swarm).where(Swarm.id == write.swarm_id).values(
        {c: write.swarm[c] for c in SWARM_TOTAL_COLUMNS if c in write.swarm}))
    if write.ledger:
        conn = await session.connection()
        rows = {(r["idempotency_key"], r["attempt"]): r for r in write.ledger}
        await conn.execute(settling_insert(conn), list(rows.values()))
    return True


def _ignoring_duplicates(conn: AsyncConnection, stmt: Insert) -> Executable:
    """INSERT … ON CONFLICT DO NOTHING: a batch retried after a lost COMMIT outcome inserts
    nothing twice (events are unique by seq)."""
    return _on_conflict_nothing(conn.dialect.name, cast(Table, stmt.table))


@functools.cache  # one statement per dialect and table: batch.executemany's plans key on it
def _on_conflict_nothing(dialect: str, table: Table) -> Executable:
    return (pg_insert if dialect == "postgresql" else sqlite_insert)(table).on_conflict_do_nothing()


def settling_insert(conn: AsyncConnection) -> Executable:
    """Ledger rows by (idempotency_key, attempt): a new row is inserted (an attempt written
    ahead as `in_flight`), an `in_flight` one is settled by its answer, a settled one is never
    touched again (so a batch retried after a lost COMMIT outcome changes nothing, and a
    write-ahead never un-settles a row)."""
    return _settling(conn.dialect.name)


@functools.cache  # one statement per dialect: batch.executemany's plans key on it
def _settling(dialect: str) -> Executable:
    table = cast(Table, GatewayCall.__table__)
    stmt = (pg_insert if dialect == "postgresql" else sqlite_insert)(table)
    return stmt.on_conflict_do_update(
        index_elements=["idempotency_key", "attempt"],
        set_={c: stmt.excluded[c] for c in LEDGER_SETTLED},
        where=table.c.outcome == AttemptOutcome.in_flight,
    )


def _update_by_key(table: Table, key: Sequence[str], columns: Sequence[str]) -> Update:
    """UPDATE table SET col = :col, ... WHERE key = :key_, for executemany with dict rows."""
    return (
        update(table)
        .where(*(table.c[k] == bindparam(f"{k}_") for k in key))
        .values({c: bindparam(c) for c in columns})
    )


_SWARM_UPDATE = _update_by_key(cast(Table, Swarm.__table__), ["id"], SWARM_STATE_COLUMNS)
_SUBTASK_UPDATE = _update_by_key(
    cast(Table, Subtask.__table__), ["swarm_id", "position", "name"], SUBTASK_STATE_COLUMNS)
_SUBTASK_INSERT = insert(cast(Table, Subtask.__table__))
_EVENT_INSERT = insert(cast(Table, Event.__table__))
_WEBHOOK_INSERT = insert(cast(Table, Webhook.__table__))
_TOOL_CALL_INSERT = insert(cast(Table, ToolCall.__table__))
_TRANSCRIPT_INSERT = insert(cast(Table, TranscriptMessage.__table__))
