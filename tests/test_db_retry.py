"""One transaction retried only while the database is unavailable."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.retry import database_unavailable, in_transaction
from app.db.session import make_db_engine, make_session_factory


async def test_transient_errors_are_retried_until_success(sqlite_url: str) -> None:
    db = make_db_engine(sqlite_url)
    calls = 0

    async def op(session: AsyncSession) -> int:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise OperationalError("SELECT 1", {}, ConnectionRefusedError("db restarting"))
        return int((await session.execute(text("SELECT 41 + 1"))).scalar_one())

    try:
        assert await in_transaction(make_session_factory(db), op, retry_for_s=5) == 42
    finally:
        await db.dispose()
    assert calls == 3


async def test_other_errors_are_raised_at_once(sqlite_url: str) -> None:
    db = make_db_engine(sqlite_url)
    calls = 0

    async def op(_: AsyncSession) -> Any:
        nonlocal calls
        calls += 1
        raise IntegrityError("INSERT", {}, Exception("duplicate key"))

    try:
        with pytest.raises(IntegrityError):
            await in_transaction(make_session_factory(db), op, retry_for_s=5)
    finally:
        await db.dispose()
    assert calls == 1


async def test_retries_stop_after_the_given_time(sqlite_url: str) -> None:
    db = make_db_engine(sqlite_url)

    async def op(_: AsyncSession) -> Any:
        raise ConnectionRefusedError("down for good")

    try:
        with pytest.raises(ConnectionRefusedError):
            await in_transaction(make_session_factory(db), op, retry_for_s=0.3)
    finally:
        await db.dispose()


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
    db = make_db_engine(sqlite_url)
    calls = 0

    async def op(_: AsyncSession) -> Any:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.3)
        raise ConnectionRefusedError("down")

    try:
        with pytest.raises(ConnectionRefusedError):
            await in_transaction(make_session_factory(db), op, retry_for_s=0.2)
    finally:
        await db.dispose()
    assert calls == 1
