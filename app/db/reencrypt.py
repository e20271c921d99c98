"""What `swarm-api reencrypt` and a process's start do with the content columns (SPEC §16):
move every value to the first key of SWARM_ENCRYPTION_KEYS, and refuse to start on content
no configured key opens."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Table,
    Text,
    and_,
    func,
    or_,
    select,
    tuple_,
    type_coerce,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.types import TypeEngine

from app.aio import wait_for
from app.crypto import HEAD_CHARS, Sealer, SealError, is_sealed, key_of
from app.db.base import table_of
from app.db.retry import in_transaction, reason
from app.db.sealed import (
    SealedJSON,
    SealedText,
    active_sealer,
    open_json,
    open_text,
    seal_json,
)
from app.db.session import is_postgres
from app.db.tables import METADATA, Swarm
from app.db.types import JSONType

log = logging.getLogger(__name__)


def sealed_tables() -> list[tuple[Table, tuple[Column[Any], ...]]]:
    """Every table with content columns, and those columns: the column registry's Sealed
    types."""
    out = []
    for table in METADATA.sorted_tables:
        cols = tuple(c for c in table.c if isinstance(c.type, (SealedText, SealedJSON)))
        if cols:
            out.append((table, cols))
    return out


def _raw(col: Column[Any]) -> ColumnElement[Any]:
    """The column as stored: a sealed value as its text, not opened."""
    return type_coerce(col, _stored_type(col))


def _stored_type(col: Column[Any]) -> TypeEngine[Any]:
    return Text() if isinstance(col.type, SealedText) else JSONType


@dataclass
class Progress:
    """Where a table's pass is: the last primary key done, rows read and rewritten."""

    after: tuple[Any, ...] | None = None
    scanned: int = 0
    rewritten: int = 0


async def reencrypt_batch(session: AsyncSession, table: Table,
                          columns: Sequence[Column[Any]], progress: Progress,
                          limit: int) -> bool:
    """Rewrite with the first key in force (`use_sealer`) the values of up to `limit` rows
    after `progress.after` (by primary key) that are plaintext or sealed with another key;
    False when the table has no rows left. The rows are locked while rewritten (PostgreSQL;
    SQLite's transaction holds the write lock), so a concurrent write is never overwritten
    with an older value."""
    pk = tuple(table.primary_key.columns)
    stmt = select(*pk, *(_raw(c) for c in columns)).order_by(*pk).limit(limit)
    if progress.after is not None:
        stmt = stmt.where(tuple_(*pk) > tuple_(*progress.after))
    if is_postgres(session):
        stmt = stmt.with_for_update()
    rows = (await session.execute(stmt)).all()
    sealer = _in_force()
    for row in rows:
        key, values = tuple(row[:len(pk)]), row[len(pk):]
        changed = {c.name: type_coerce(_moved(sealer, c, v), _stored_type(c))
                   for c, v in zip(columns, values, strict=True) if _stale(sealer, v)}
        if changed:
            await session.execute(
                update(table).where(and_(*(c == k for c, k in zip(pk, key, strict=True))))
                .values(changed))
            progress.rewritten += 1
    progress.scanned += len(rows)
    if rows:
        progress.after = tuple(rows[-1][:len(pk)])
    return len(rows) == limit


def _stale(sealer: Sealer, value: Any) -> bool:
    """A value to rewrite: plaintext, or sealed with another key than the first."""
    if value is None:
        return False
    return not (is_sealed(value) and sealer.is_current(value))


def _moved(sealer: Sealer, col: Column[Any], value: Any) -> Any:
    if isinstance(col.type, SealedText):
        return sealer.seal(open_text(value) or "")
    return seal_json(open_json(value))


def _in_force() -> Sealer:
    sealer = active_sealer()
    if sealer is None:
        raise SealError("SWARM_ENCRYPTION_KEYS is unset: no key to encrypt with")
    return sealer


async def check_keys(session: AsyncSession, sealer: Sealer | None) -> int:
    """Raise SealError when the content a start samples is sealed with a key the process does
    not have (or any key, with none configured): such a process could read none of it.

    The sample is the tasks of the swarms at both ends of the primary key (ids are random, so
    two swarms of any age), and of each only its head, which names its key: one statement of
    index lookups, its cost the same whatever the table holds. Returns how many values it
    read."""
    swarms = table_of(Swarm)
    ends = or_(swarms.c.id == select(func.min(swarms.c.id)).scalar_subquery(),
               swarms.c.id == select(func.max(swarms.c.id)).scalar_subquery())
    head = func.substr(_raw(swarms.c.task), 1, HEAD_CHARS, type_=Text())
    values = (await session.execute(select(head).where(ends))).scalars().all()
    known = sealer.key_ids if sealer is not None else frozenset()
    for value in values:
        if not is_sealed(value):
            continue
        if sealer is None:
            raise SealError("the database holds encrypted content and SWARM_ENCRYPTION_KEYS "
                            "is unset")
        if key_of(value) not in known:
            raise SealError(f"the database holds content encrypted with key "
                            f"{key_of(value)!r}, which SWARM_ENCRYPTION_KEYS does not hold")
    return len(values)


async def check_keys_at_start(sessions: async_sessionmaker[AsyncSession],
                              sealer: Sealer | None, timeout_s: float = 5.0) -> None:
    """`check_keys` when a process starts: a SealError stops it; a database that does not
    answer (or is not migrated yet) does not, as /readyz reports that."""
    async def check() -> None:
        async with sessions() as session, session.begin():
            await check_keys(session, sealer)

    try:
        await wait_for(check(), timeout_s)
    except SealError:
        raise
    except Exception as exc:  # the database's state is readiness's to report
        log.warning("encryption keys not checked at start: %s", reason(exc))


_CONFLICTS = ("40P01", "40001")  # deadlock, serialization: another writer won; try again


async def reencrypt_all(sessions: async_sessionmaker[AsyncSession], batch: int,
                        retry_for_s: float = 30.0) -> dict[str, Progress]:
    """Every content value of every table moved to the first key in force, table by table, `batch`
    rows per transaction (each committed: a pass stopped half-way keeps what it did, and the
    next one skips what is already on the first key). Returns each table's progress."""
    out: dict[str, Progress] = {}
    for table, columns in sealed_tables():
        progress = out[table.name] = Progress()
        more = True
        while more:
            more = await _batch_retried(sessions, table, columns, progress, batch,
                                        retry_for_s)
    return out


async def _batch_retried(sessions: async_sessionmaker[AsyncSession], table: Table,
                         columns: Sequence[Column[Any]], progress: Progress, batch: int,
                         retry_for_s: float) -> bool:
    for tries in range(5):
        at = Progress(progress.after, progress.scanned, progress.rewritten)
        try:
            more = await in_transaction(
                sessions, functools.partial(reencrypt_batch, table=table, columns=columns,
                                            progress=at, limit=batch),
                retry_for_s=retry_for_s)
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) not in _CONFLICTS or tries == 4:
                raise
            await asyncio.sleep(0.05 * (tries + 1))
            continue
        progress.after, progress.scanned, progress.rewritten = at.after, at.scanned, at.rewritten
        return more
    raise AssertionError("unreachable: the last try raises")

