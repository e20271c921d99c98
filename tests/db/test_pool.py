"""The database pool serves waiting checkouts in arrival order (PostgreSQL, real connections)."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.aio import wait_for
from app.db import session as session_module
from app.db.driver import fetchrow_pooled
from app.db.pool import FairQueuePool
from app.db.retry import database_unavailable
from app.db.session import make_db_engine
from tests.helpers import until
from tests.procs import Db

pytestmark = pytest.mark.postgres


async def test_a_connection_goes_to_the_longest_waiter_not_to_whoever_asks_again(
        db_url: str) -> None:
    """Two connections, both held; three requests queue; each holder gives its connection back
    and at once asks for one again (as a busy request handler does). Under SQLAlchemy's stock
    async pool the holder takes it straight back and the waiters queue again behind it (the
    order seen: h0, h1, w3, w1, w2); here the waiters go first, in the order they came. No
    overflow: a returned overflow connection is closed, and opening a new one (like a
    pre-ping's round trip) would blur the order of checkouts."""
    assert isinstance(make_db_engine(db_url).pool, FairQueuePool)  # what the service uses
    engine = create_async_engine(db_url, poolclass=FairQueuePool, pool_size=2, max_overflow=0)
    order: list[str] = []
    try:
        held = [await engine.connect() for _ in range(2)]

        async def waiter(name: str) -> None:
            async with engine.connect() as conn:
                order.append(name)  # checked out: the order under test
                await conn.execute(text("SELECT 1"))

        waiters = []
        for name in ("w1", "w2", "w3"):
            waiters.append(asyncio.create_task(waiter(name)))
            await asyncio.sleep(0.05)  # queued one after the other

        async def again(conn: AsyncConnection, name: str) -> None:
            await conn.close()
            async with engine.connect() as back:
                order.append(name)
                await back.execute(text("SELECT 1"))

        await wait_for(asyncio.gather(*(again(c, f"h{i}") for i, c in enumerate(held)),
                                              *waiters), 30)
    finally:
        await engine.dispose()
    assert order[:3] == ["w1", "w2", "w3"], order


@pytest.mark.parametrize(("idle_s", "survives"), [(0.0, True), (3600.0, False)])
async def test_a_connection_idle_past_the_limit_is_pinged_and_replaced_when_dead(
        db_url: str, monkeypatch: pytest.MonkeyPatch, idle_s: float, survives: bool) -> None:
    """A pooled connection the server closed (a restart, an idle timeout) is found by a ping
    at checkout once it has been idle for PING_IF_IDLE_S, and replaced without an error; one
    returned more recently is used without the ping's round trip (here: the limit set past the
    test's length, so the dead connection is used, and fails)."""
    monkeypatch.setattr(session_module, "PING_IF_IDLE_S", idle_s)
    engine = make_db_engine(db_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        db = Db(db_url)
        await db.fetch("SELECT pg_terminate_backend($1)", pid)

        async def gone() -> bool:
            return not await db.fetch("SELECT 1 FROM pg_stat_activity WHERE pid = $1", pid)

        await until(gone, 10, "the backend to exit")
        if survives:
            async with engine.connect() as conn:
                again = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            assert again != pid
        else:
            with pytest.raises(DBAPIError):
                async with engine.connect() as conn:
                    await conn.execute(text("SELECT 1"))
    finally:
        await engine.dispose()


async def test_a_lone_client_gets_the_connection_it_returned_and_no_ping(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten connections pooled, then one client checking out one at a time, PING_IF_IDLE_S / 8
    apart: the pool hands back the connection returned last (LIFO), one backend serves every
    checkout and none is pinged but the first. First-in-first-out handed out the stalest
    connection each time, idle ten checkouts long, past the limit: a ping on ~9 in 10."""
    pings = 0
    ping = session_module._ping_if_idle

    def counting(dbapi_conn: object, record: object, proxy: object) -> None:
        nonlocal pings
        idle = time.monotonic() - record.info.get("returned_at", 0.0)  # type: ignore[attr-defined]
        pings += idle >= session_module.PING_IF_IDLE_S
        ping(dbapi_conn, record, proxy)

    monkeypatch.setattr(session_module, "_ping_if_idle", counting)
    engine = make_db_engine(db_url)
    try:
        async def hold() -> None:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT pg_sleep(0.05)"))

        await asyncio.gather(*(hold() for _ in range(10)))
        await asyncio.sleep(session_module.PING_IF_IDLE_S)  # every pooled one is stale now
        pids = set()
        for _ in range(20):
            async with engine.connect() as conn:
                pids.add((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())
            await asyncio.sleep(session_module.PING_IF_IDLE_S / 8)
        assert len(pids) == 1
        assert pings == 1  # the first checkout's, after the pause
    finally:
        await engine.dispose()


async def test_a_burst_reuses_the_connections_of_the_last_one(db_url: str) -> None:
    """The service's pool keeps every connection it opened: a second burst as wide as the
    pool opens none (an overflow connection was closed on its return and opened again at the
    next burst — a connect and a PostgreSQL backend every few requests under load)."""
    engine = make_db_engine(db_url)
    width = 20  # the service's pool, as many as 200 clients creating swarms keep busy
    try:
        async def burst() -> set[int]:
            all_in = asyncio.Barrier(width)

            async def one() -> int:
                async with engine.connect() as conn:
                    pid = int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())
                    await all_in.wait()  # every connection out at once
                    return pid

            return set(await asyncio.gather(*(one() for _ in range(width))))

        first = await burst()
        assert len(first) == width
        assert await burst() == first
    finally:
        await engine.dispose()


async def test_a_statement_alone_uses_the_pools_connection_and_gives_it_back(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fetchrow_pooled` answers its row on a pooled connection and checks it back in, after
    an error too; one the server closed under it is invalidated, not handed out again. It
    takes the pool's connection itself: an engine `Connection` around it costs a third
    greenlet hand-off a statement (its start, `get_raw_connection`, its close)."""
    engine = make_db_engine(db_url, pool_size=2)

    def no_engine_connection(*_: object, **__: object) -> None:
        raise AssertionError("an engine Connection for a statement alone")

    monkeypatch.setattr(AsyncEngine, "connect", no_engine_connection)
    monkeypatch.setattr(session_module, "PING_IF_IDLE_S", 3600.0)  # the dead one is used

    async def backend() -> int:
        row = await fetchrow_pooled(engine, "SELECT pg_backend_pid()", ())
        assert row is not None
        return int(row[0])

    try:
        row = await fetchrow_pooled(engine, "SELECT $1::int + 1", (41,))
        assert row is not None and row[0] == 42
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        with pytest.raises(asyncpg.DivisionByZeroError):
            await fetchrow_pooled(engine, "SELECT 1 / $1::int", (0,))
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        pid = await backend()  # the pool hands out the connection returned last
        db = Db(db_url)
        await db.fetch("SELECT pg_terminate_backend($1)", pid)

        async def gone() -> bool:
            return not await db.fetch("SELECT 1 FROM pg_stat_activity WHERE pid = $1", pid)

        await until(gone, 10, "the backend to exit")
        with pytest.raises(Exception) as lost:  # the driver's error, as raised
            await backend()
        assert database_unavailable(lost.value)
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        assert pid not in {await backend() for _ in range(4)}  # invalidated, not handed out
    finally:
        await engine.dispose()
