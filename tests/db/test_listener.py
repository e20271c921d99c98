"""ChangeListener: LISTEN again after the connection is lost, and say so (`on_connect`) each time,
since whatever was notified while nobody listened is gone: the scheduler claims and readers
re-read at once instead of at their next poll."""

from __future__ import annotations

import asyncpg

from app.db.listener import ChangeListener
from app.db.session import asyncpg_dsn
from app.engine.waiters import SwarmNotifier
from tests.helpers import until


async def test_reconnects_relistens_and_says_so(pg_url: str) -> None:
    heard: list[str] = []
    connects: list[int] = []
    listener = ChangeListener(pg_url, {"swarm_test": heard.append}, check_every_s=0.05,
                              on_connect=lambda: connects.append(len(heard)))
    admin = await asyncpg.connect(asyncpg_dsn(pg_url))
    listener.start()
    try:
        await until(lambda: connects, 10, "the first LISTEN")
        assert connects == [0]
        await admin.execute("SELECT pg_notify('swarm_test', 'one')")
        await until(lambda: heard, 5, "the first notification")

        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'")  # the listener's: nobody else is here
        assert killed == 1
        await until(lambda: len(connects) == 2, 10, "the LISTEN again after a reconnect")
        await admin.execute("SELECT pg_notify('swarm_test', 'two')")
        await until(lambda: len(heard) == 2, 5, "a notification after the reconnect")
        assert heard == ["one", "two"] and connects == [0, 1]
    finally:
        await listener.stop()
        await admin.close()


def test_notify_all_wakes_every_waiting_reader() -> None:
    notifier = SwarmNotifier()
    a, b = notifier.arm("a"), notifier.arm("b")
    notifier.notify_all()
    assert a.is_set() and b.is_set()
    assert a.take() == (None, True)  # woken without a status: the reader reads it
