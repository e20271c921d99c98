"""One transaction retried only while the database is unavailable."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.retry import database_unavailable, in_transaction
from app.db.session import make_db_engine, make_session_factory


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
