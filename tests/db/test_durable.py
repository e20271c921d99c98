"""Creations that commit without waiting for their WAL flush (a quota-checked one frees the
tenant's lock at its commit) and are answered only once a shared flush covers them
(app/db/durable.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.db import durable
from app.db.session import asyncpg_dsn
from tests.conftest import make_settings, start_harness
from tests.support import PG_BIN, PrivatePostgres, private_postgres, throwaway_db

AGENTS = {"task": "t", "agents": [{"name": "a"}, {"name": "b", "depends_on": ["a"]}]}


@pytest.fixture
def engine(pg_url: str) -> Iterator[AsyncEngine]:
    yield create_async_engine(pg_url)


async def test_waiters_at_once_share_one_flush(engine: AsyncEngine) -> None:
    flusher = durable.flusher(engine)
    await asyncio.gather(*(durable.flushed(engine) for _ in range(50)))
    # the first waiter's flush, and the next one for those who came while it was sent
    assert 1 <= flusher.flushes <= 2
    before = flusher.flushes
    await durable.flushed(engine)
    assert flusher.flushes == before + 1
    await engine.dispose()


async def test_a_waiter_arriving_during_a_flush_waits_for_the_next(engine: AsyncEngine) -> None:
    flusher = durable.flusher(engine)
    first = asyncio.create_task(durable.flushed(engine))
    await asyncio.sleep(0)  # the first flush is on its way
    second = asyncio.create_task(durable.flushed(engine))
    await first
    assert not second.done() or flusher.flushes == 2
    await second
    assert flusher.flushes == 2
    await engine.dispose()


async def test_a_failed_flush_fails_its_waiters_and_the_next_one_flushes(
        engine: AsyncEngine) -> None:
    flusher = durable.flusher(engine)
    original = durable.FLUSH
    durable.FLUSH = "SELECT no_such_function()"
    try:
        got = await asyncio.gather(*(durable.flushed(engine) for _ in range(3)),
                                   return_exceptions=True)
    finally:
        durable.FLUSH = original
    assert all(isinstance(e, asyncpg.UndefinedFunctionError) for e in got), got
    await durable.flushed(engine)
    assert flusher.flushes == 1
    await engine.dispose()


async def test_a_flush_cancelled_cancels_its_waiters_and_the_next_one_flushes(
        engine: AsyncEngine) -> None:
    flusher = durable.flusher(engine)
    waiter = asyncio.create_task(durable.flushed(engine))
    await asyncio.sleep(0)  # the flush is on its way
    assert flusher._task is not None
    flusher._task.cancel()
    await asyncio.wait({waiter}, timeout=5)
    assert waiter.cancelled()  # not left waiting for a flush nobody sends
    await durable.flushed(engine)
    assert flusher.flushes == 1
    await engine.dispose()


@pytest.fixture(scope="module")
def slow_wal_writer() -> Iterator[PrivatePostgres]:
    """A server that flushes WAL only when a commit asks (its WAL writer waits 10 s): what a
    commit without its flush wrote is lost in a crash before then."""
    with private_postgres("synchronous_commit=on", "wal_writer_delay=10000ms") as server:
        yield server


@pytest.fixture
def slow_db(slow_wal_writer: PrivatePostgres) -> Iterator[str]:
    with throwaway_db("swarm_durable", server=slow_wal_writer.url) as url:
        yield url


@pytest.mark.skipif(not PG_BIN, reason="needs PostgreSQL's server binaries (initdb, pg_ctl)")
@pytest.mark.parametrize("flushed", [True, False], ids=["answered-after-flush", "no-flush"])
async def test_an_answered_quota_checked_creation_survives_a_database_crash(
        slow_wal_writer: PrivatePostgres, slow_db: str, flushed: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC §8's default quotas are checked in the creation's statement, which commits without
    waiting for its flush: the 202 waits for a flush that covers it, so a crash of the database
    right after the answer keeps the swarm. Without that flush (`no-flush`) the same crash
    loses it: the statement did commit asynchronously, and the flush is what keeps it."""
    if not flushed:
        async def nothing(engine: AsyncEngine) -> None:
            return None
        monkeypatch.setattr(durable, "flushed", nothing)
    h, close = await start_harness(make_settings(slow_db), run_engine=False)
    try:
        r = await h.post(AGENTS)
        assert r.status_code == 202, r.text
        await asyncio.to_thread(slow_wal_writer.crash)
        await asyncio.to_thread(slow_wal_writer.ctl, "start")
        conn = await asyncpg.connect(asyncpg_dsn(slow_db))
        try:
            found = await conn.fetch("SELECT status FROM swarms WHERE id = $1", r.json()["id"])
        finally:
            await conn.close()
        assert [row["status"] for row in found] == (["queued"] if flushed else [])
    finally:
        await close()
