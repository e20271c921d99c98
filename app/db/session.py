"""The SQLAlchemy engine and session factory for PostgreSQL (asyncpg) and embedded SQLite
(aiosqlite)."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from datetime import datetime
from typing import Any

import pydantic_core
from sqlalchemy import event, func, select
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.db.pool import FairQueuePool
from app.db.types import utcnow

SessionFactory = async_sessionmaker[AsyncSession]


def is_postgres(session: AsyncSession) -> bool:
    """PostgreSQL, else embedded SQLite: for the statements each dialect writes its own way."""
    return session.get_bind().dialect.name == "postgresql"


def asyncpg_dsn(database_url: str) -> str:
    """The plain asyncpg DSN of a `postgresql+asyncpg://` SQLAlchemy URL."""
    return database_url.replace("postgresql+asyncpg://", "postgresql://", 1)


class _RollsBackOnClose(sqlite3.Connection):
    """A SQLite connection that ends its transaction before it closes.

    A statement cancelled while it runs (its stream's client gone, `unless_gone`) makes
    SQLAlchemy invalidate its connection, and aiosqlite closes it while the statement's cursor
    still holds it: sqlite3_close_v2 then keeps it as a zombie, its transaction (BEGIN
    IMMEDIATE: the write lock) open, until that cursor is garbage-collected, and every writer
    meanwhile fails 'database is locked'. Called on aiosqlite's thread, as all its calls are."""

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):  # closed already, or nothing to roll back
            if self.in_transaction:
                self.rollback()
        super().close()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets readers run beside the writer; FULL makes every commit durable across power loss
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def _sqlite_no_autobegin(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # the driver's own deferred BEGIN is replaced below


def _sqlite_begin_immediate(conn: Any) -> None:
    # a deferred transaction that reads, then writes fails at once (SQLITE_BUSY, no busy wait)
    # when another connection committed in between; taking the write lock up front makes every
    # transaction wait its turn instead (SQLAlchemy's documented aiosqlite recipe)
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_db_engine(url: str, *, pool_size: int = 20) -> AsyncEngine:
    """An async engine with the pragmas / pool settings each backend needs."""
    # hide_parameters: a failed statement's error (logged, maybe returned) must not carry its
    # parameters — prompts, outputs and task texts
    # JSON read back by pydantic-core's parser: the same values as json.loads (big integers,
    # infinities, duplicate keys: the last), a tenth of its time on the small documents a
    # view reads per subtask (depends_on, tools, error)
    if url.startswith("sqlite"):
        engine = create_async_engine(
            url, connect_args={"timeout": 30, "factory": _RollsBackOnClose},
            hide_parameters=True, json_deserializer=pydantic_core.from_json)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        event.listen(engine.sync_engine, "connect", _sqlite_no_autobegin)
        event.listen(engine.sync_engine, "begin", _sqlite_begin_immediate)
        return engine
    # LIFO: the connection returned last goes out first, so a connection idle long enough to be
    # pinged (_ping_if_idle) is only taken when the ones in use do not suffice; FIFO handed
    # a lone client the pool's stalest one, pinged on every request.
    # No overflow: an overflow connection is closed when it comes back to a full pool and
    # opened again at the next burst — under 200 clients creating swarms, a connect (and a
    # PostgreSQL backend started) every few requests. The connections a burst needs stay open
    # instead.
    engine = create_async_engine(
        url, poolclass=FairQueuePool, pool_size=pool_size, max_overflow=0,
        pool_recycle=1800, pool_use_lifo=True, hide_parameters=True,
        json_deserializer=pydantic_core.from_json,
    )
    event.listen(engine.sync_engine, "connect", _returned)
    event.listen(engine.sync_engine, "checkin", _returned)
    event.listen(engine.sync_engine, "checkout", _ping_if_idle)
    return engine


# SQLAlchemy's pool_pre_ping pings on every checkout: one round trip of the ~6 a `POST /swarms`
# makes. A connection checked out within this of its return cannot have missed a database
# restart (the server is down for longer than that: a connection returned before the restart
# and taken after it has been idle for at least the downtime), so only one idle longer (where a
# restart or an idle timeout may have closed it) is pinged first. Under load and from a busy
# client, connections come back within milliseconds: the ping is skipped on nearly every POST.
PING_IF_IDLE_S = 0.1


def _returned(_dbapi_conn: Any, record: Any) -> None:
    record.info["returned_at"] = time.monotonic()


def _ping_if_idle(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
    if time.monotonic() - record.info.get("returned_at", 0.0) < PING_IF_IDLE_S:
        return
    try:
        dbapi_conn.ping()
    except Exception as exc:  # the pool invalidates it and checks out another (3 tries)
        raise DisconnectionError(f"stale pooled connection: {exc!r}") from exc


def make_session_factory(engine: AsyncEngine) -> SessionFactory:
    return async_sessionmaker(engine, expire_on_commit=False)


async def db_now(session: AsyncSession) -> datetime:
    """Database time on Postgres (leases never trust worker clocks); local time on SQLite,
    which runs in this one process."""
    if is_postgres(session):
        value: datetime = (await session.execute(select(func.now()))).scalar_one()
        return value
    return utcnow()
