"""Postgres LISTEN: wake-ups by swarm id (channels in app/db/notify.py); polling stays the
fallback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

import asyncpg

from app.aio import cancel_and_wait
from app.db.session import asyncpg_dsn

log = logging.getLogger(__name__)


class PgListener:
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
                        await asyncio.wait_for(conn.close(), 2)
