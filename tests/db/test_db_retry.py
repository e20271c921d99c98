"""One transaction retried only while the database is unavailable."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.retry import database_not_migrated, database_unavailable, in_transaction, reason
from app.db.session import make_db_engine, make_session_factory
from tests.support import PG_URL, with_db


async def run(url: str, op: Callable[[AsyncSession], Awaitable[Any]], retry_for_s: float
              ) -> Any:
    """`in_transaction(op)` on a database engine of its own, disposed of afterwards."""
    db = make_db_engine(url)
    try:
        return await in_transaction(make_session_factory(db), op, retry_for_s=retry_for_s)
    finally:
        await db.dispose()


async def test_transient_errors_are_retried_until_success(sqlite_url: str) -> None:
    calls = 0

    async def op(session: AsyncSession) -> int:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise OperationalError("SELECT 1", {}, ConnectionRefusedError("db restarting"))
        return int((await session.execute(text("SELECT 41 + 1"))).scalar_one())

    assert await run(sqlite_url, op, retry_for_s=5) == 42
    assert calls == 3


async def test_other_errors_are_raised_at_once(sqlite_url: str) -> None:
    calls = 0

    async def op(_: AsyncSession) -> Any:
        nonlocal calls
        calls += 1
        raise IntegrityError("INSERT", {}, Exception("duplicate key"))

    with pytest.raises(IntegrityError):
        await run(sqlite_url, op, retry_for_s=5)
    assert calls == 1


async def test_retries_stop_after_the_given_time(sqlite_url: str) -> None:
    async def op(_: AsyncSession) -> Any:
        raise ConnectionRefusedError("down for good")

    with pytest.raises(ConnectionRefusedError):
        await run(sqlite_url, op, retry_for_s=0.3)


@pytest.mark.parametrize("exc,expected", [
    (ConnectionResetError(), True),
    (OperationalError("x", {}, Exception()), True),
    (IntegrityError("x", {}, Exception()), False),
    (ValueError("bug"), False),
])
def test_database_unavailable_classifies(exc: BaseException, expected: bool) -> None:
    assert database_unavailable(exc) is expected


async def _error_of(url: str, sql: str = "SELECT 1") -> Exception:
    db = make_db_engine(url)
    try:
        async with db.connect() as conn:
            await conn.execute(text(sql))
    except Exception as exc:
        return exc
    finally:
        await db.dispose()
    raise AssertionError(f"{sql} ran")


@pytest.mark.postgres
async def test_what_postgresql_refuses_is_classified_and_told_in_a_line(pg_url: str) -> None:
    """A database not created yet or a role it does not know: no connection to work with,
    retried as an outage, its reason readable; a table not there yet: not migrated."""
    missing_db = await _error_of(with_db(PG_URL, "swarm_never_created"))
    assert database_unavailable(missing_db) and not database_not_migrated(missing_db)
    assert reason(missing_db) == 'Error: database "swarm_never_created" does not exist'
    as_nobody = make_url(pg_url).set(username="swarm_no_such_role", password=None)
    unknown_role = await _error_of(as_nobody.render_as_string(hide_password=False))
    assert database_unavailable(unknown_role), unknown_role
    assert 'role "swarm_no_such_role" does not exist' in reason(unknown_role)
    behind = await _error_of(pg_url, "SELECT no_such_column FROM swarms")
    assert database_not_migrated(behind) and not database_unavailable(behind)
    assert database_not_migrated(await _error_of(pg_url, "SELECT 1 FROM no_such_table"))
    bug = await _error_of(pg_url, "SELECT 1/0")
    assert not database_not_migrated(bug) and not database_unavailable(bug)
    assert "\n" not in reason(bug) and "SELECT" not in reason(bug)  # never the statement


async def test_the_retry_window_counts_from_the_first_try(sqlite_url: str) -> None:
    """The first try runs before tenacity is entered: its time is part of the window."""
    calls = 0

    async def op(_: AsyncSession) -> Any:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.3)
        raise ConnectionRefusedError("down")

    with pytest.raises(ConnectionRefusedError):
        await run(sqlite_url, op, retry_for_s=0.2)
    assert calls == 1
