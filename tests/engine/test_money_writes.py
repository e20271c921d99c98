"""Money is never dropped while its owner holds the lease: the group commit retries a write
the database cannot take (SQLite's write lock held by another connection, an outage) past its
retry window until it commits (a process that no longer drives the swarm gives up), and the
heartbeat keeps the daily-cap reservations of calls in flight live with the leases."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import event, func, select

from app.db.leases import LeaseLost
from app.db.session import SessionFactory, db_now, make_db_engine, make_session_factory
from app.db.tables import DailyReservation, GatewayCall
from app.engine.budget import DailyCap
from app.engine.writer import StateWriter
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent, until
from tests.writer_support import BARE, OWNER
from tests.writer_support import claimed_swarm as _claimed_swarm
from tests.writer_support import write as _write

WINDOW_S = 0.3


@pytest.fixture
async def idle(sqlite_url: str) -> AsyncIterator[Harness]:
    h, close = await start_harness(make_settings(sqlite_url), run_engine=False)
    yield h
    await close()


@pytest.fixture
async def impatient(sqlite_url: str) -> AsyncIterator[SessionFactory]:
    """Sessions that wait 50 ms for SQLite's write lock (the app's wait 10 s)."""
    engine = make_db_engine(sqlite_url)

    @event.listens_for(engine.sync_engine, "connect")
    def _short_wait(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA busy_timeout=50")
        cur.close()

    yield make_session_factory(engine)
    await engine.dispose()


def _file(url: str) -> str:
    return url.split("///", 1)[1]


# another process holding SQLite's write lock until its stdin closes
_HOLD = ("import sqlite3, sys\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "c.execute('BEGIN IMMEDIATE')\n"
         "print('locked', flush=True)\n"
         "sys.stdin.read()\n"
         "c.execute('ROLLBACK')\n")


@contextlib.contextmanager
def _locked(path: str, by: str) -> Iterator[None]:
    """SQLite's write lock held by another connection of this process, or another process."""
    if by == "connection":
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"locked\n"
        yield
    finally:
        proc.stdin.close()
        proc.wait(10)


async def _under_lock(url: str, writer: StateWriter, swarm_id: str, epoch: int,
                      caplog: pytest.LogCaptureFixture, by: str = "connection"
                      ) -> asyncio.Future[None]:
    """A ledger row's write submitted while another connection (`by`) holds the write lock,
    which it lets go only once the writer said it retries past its window (or gave up)."""
    with _locked(_file(url), by):
        fut = writer.submit(_write(swarm_id, epoch, **{**BARE, "ledger": _write(
            swarm_id, epoch).ledger}))
        for _ in range(400):
            if fut.done() or "retrying while their leases are held" in caplog.text:
                break
            await asyncio.sleep(0.05)
    await asyncio.wait([fut], timeout=30)
    return fut


async def _ledger_rows(h: Harness, swarm_id: str) -> int:
    async with h.app.state.sessions() as s:
        return int((await s.execute(select(func.count()).select_from(GatewayCall).where(
            GatewayCall.swarm_id == swarm_id))).scalar_one())


@pytest.mark.parametrize("by", ["connection", "process"])
async def test_a_ledger_row_outlasts_a_write_lock_held_past_the_window(
        idle: Harness, impatient: SessionFactory, sqlite_url: str, by: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "app.engine.writer")
    swarm_id, epoch = await _claimed_swarm(idle)
    writer = StateWriter(impatient, OWNER, retry_for_s=WINDOW_S, holding=lambda _: True)
    writer.start()
    try:
        fut = await _under_lock(sqlite_url, writer, swarm_id, epoch, caplog, by)
    finally:
        await writer.close()
    assert "retrying while their leases are held" in caplog.text  # it outlasted the window
    assert fut.done() and fut.exception() is None
    assert await _ledger_rows(idle, swarm_id) == 1


async def test_a_process_that_no_longer_drives_the_swarm_gives_up(
        idle: Harness, impatient: SessionFactory, sqlite_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    swarm_id, epoch = await _claimed_swarm(idle)
    writer = StateWriter(impatient, OWNER, retry_for_s=WINDOW_S, holding=lambda _: False)
    writer.start()
    try:
        fut = await _under_lock(sqlite_url, writer, swarm_id, epoch, caplog)
    finally:
        await writer.close()
    assert isinstance(fut.exception(), LeaseLost)  # its takeover settles what was in flight
    assert await _ledger_rows(idle, swarm_id) == 0


async def test_reservations_live_as_long_as_their_owners_leases(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daily cap's own refresher stalled (as a long pause of it would): the heartbeat that
    extends the swarm's lease pushes the reservation of its call in flight along with it."""
    async def stalled(self: DailyCap) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(DailyCap, "_refresh_loop", stalled)
    settings = make_settings(database_url, lease_seconds=1.0, daily_budget_usd="100")
    h, close = await start_harness(settings)
    try:
        body = {"task": "t", "synthesis": {"strategy": "none"}, "max_tokens": 50,
                "agents": [agent("a", "[[sim latency_ms=4000]]")]}
        swarm_id = (await h.post(body)).json()["id"]

        async def expiry() -> datetime | None:
            async with h.app.state.sessions() as s:
                return (await s.execute(select(func.max(DailyReservation.expires_at))))\
                    .scalar_one_or_none()

        first = await until(expiry, 10, "the call's reservation")
        # more than a lease on, the reservation is still ahead of the database's clock
        later = await until(lambda: _past(expiry, first + timedelta(seconds=1.5)), 10,
                            "the reservation pushed past its first lease")
        async with h.app.state.sessions() as s:
            now = await db_now(s)
        assert later > now
        assert (await h.wait(swarm_id))["status"] == "succeeded"
    finally:
        await close()


async def _past(expiry: Callable[[], Any], bound: datetime) -> datetime | None:
    value = await expiry()
    return value if value is not None and value > bound else None


async def test_a_reservation_no_cap_holds_is_not_kept_live(sqlite_url: str) -> None:
    """A reservation row of this process that none of its caps holds (its reserve was cut
    off, or retried after a lost answer) is no call in flight: the heartbeat does not keep it
    live, so a call that cannot fit beside it is refused once it lapses instead of waiting
    for it as long as the waiting swarm's own lease is held (for ever)."""
    settings = make_settings(sqlite_url, lease_seconds=1.0, daily_budget_usd="0.001")
    h, close = await start_harness(settings)
    try:
        async with h.app.state.sessions() as s, s.begin():
            now = await db_now(s)
            s.add(DailyReservation(id="o" * 32, day=now.date(), owner=h.app.state.engine.owner,
                                   amount=Decimal("0.0009"), expires_at=now + timedelta(
                                       seconds=1)))
        body = {"task": "t", "synthesis": {"strategy": "none"}, "max_tokens": 1000,
                "agents": [agent("a")]}
        data = await h.wait((await h.post(body)).json()["id"], 15)
        assert data["status"] == "failed", data
        assert data["error"]["code"] == "daily_budget_exceeded", data["error"]
    finally:
        await close()
