"""The SQLite engine (app/db/session.py): a connection closed in the middle of its transaction
(a statement cancelled while it ran) takes the transaction's write lock with it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from app.db.session import make_db_engine, make_session_factory
from tests.helpers import HeldStatement, collection_off, until, write_locked


async def test_a_statement_cancelled_while_it_runs_leaves_no_write_lock(tmp_path: Path) -> None:
    """A read's transaction (BEGIN IMMEDIATE: the write lock) whose statement is cancelled while
    the driver's thread runs it, as a stream's is when its client leaves. SQLAlchemy invalidates
    the connection and the driver closes it once the statement is done; the statement's cursor
    still holds it, so SQLite kept the connection, its transaction and the lock until that
    cursor was collected (the collector is off here: it would have come at some point)."""
    path = tmp_path / "t.db"
    engine = make_db_engine(f"sqlite+aiosqlite:///{path}")
    held = HeldStatement()
    invalidated: list[BaseException | None] = []

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.create_function(held.NAME, 0, held)

    event.listen(engine.sync_engine, "connect", on_connect)
    event.listen(engine.sync_engine.pool, "invalidate",
                 lambda _conn, _record, exc: invalidated.append(exc))
    sessions = make_session_factory(engine)

    async def read() -> None:
        async with sessions() as s, s.begin():
            await s.execute(text(f"SELECT {held.NAME}()"))

    try:
        with collection_off():
            task = asyncio.create_task(read())
            await held.running()
            assert write_locked(path)
            task.cancel()
            await until(lambda: invalidated, 5, "the cancelled statement's connection dropped")
            held.release()  # the statement ends; its connection is closed after it
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(lambda: not write_locked(path), 5, "the write lock released")
            async with sessions() as s, s.begin():  # a writer goes ahead at once
                await s.execute(text("CREATE TABLE t (x INTEGER)"))
    finally:
        held.release()
        await engine.dispose()
