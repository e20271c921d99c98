"""PostgreSQL LISTEN: wake-ups by swarm id (channels in app/db/notify.py), polling staying the
fallback; and NOTIFY from a connection of its own (`NotifySender`), for what is sent outside
any transaction (a worker's token deltas)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

import asyncpg

from app.aio import cancel_and_wait, wait_for
from app.db.session import asyncpg_dsn

log = logging.getLogger(__name__)
_SEND = "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p"


class ChangeListener:
    """One dedicated connection LISTENing on some channels, health-checked and re-LISTENed
    after a reconnect. Handlers run in the event loop and must not block."""

    def __init__(self, database_url: str, handlers: Mapping[str, Callable[[str], None]],
                 check_every_s: float = 5.0,
                 on_connect: Callable[[], None] | None = None) -> None:
        self._dsn = asyncpg_dsn(database_url)
        self._handlers = dict(handlers)
        # called once LISTENing, after every (re)connect: what was notified while nobody
        # listened (before the first LISTEN, or in a reconnect's gap) is lost, so re-read now
        # rather than at the next poll
        self._on_connect = on_connect
        self._check_every_s = check_every_s
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pg-listener")

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    def _dispatch(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        handler = self._handlers.get(channel)
        if handler is not None:
            handler(payload)

    async def _run(self) -> None:
        delay = 0.5
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self._dsn, timeout=5)
                for channel in self._handlers:
                    await conn.add_listener(channel, self._dispatch)
                self.connected.set()
                delay = 0.5
                if self._on_connect is not None:
                    self._on_connect()
                # a silent connection can be dead: ask it something now and then
                while True:
                    await asyncio.sleep(self._check_every_s)
                    await conn.fetchval("SELECT 1", timeout=5)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # reconnect on anything; polling covers the gap
                self.connected.clear()
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 10.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await wait_for(conn.close(), 2)


class NotifySender:
    """NOTIFYs of one channel from one connection of its own, in the order sent (NOTIFYs of
    one session arrive in that order); connected at the first send and again after a loss.
    Used by one task at a time."""

    def __init__(self, database_url: str, channel: str) -> None:
        self._dsn = asyncpg_dsn(database_url)
        self._channel = channel
        self._conn: asyncpg.Connection | None = None

    async def send(self, payloads: list[str]) -> None:
        """One statement NOTIFYing each payload; a failure closes the connection and raises."""
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self._dsn, timeout=5)
            await self._conn.execute(_SEND, self._channel, payloads)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await wait_for(conn.close(), 2)
