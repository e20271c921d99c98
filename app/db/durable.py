"""Commits made durable after the fact: a statement that commits without waiting for its WAL
flush (`synchronous_commit` off for its transaction: it releases its locks sooner) is durable
once a later commit of any session has been flushed, because PostgreSQL flushes its WAL in
order. `flushed(engine)` waits for such a commit, shared by every caller waiting at once: one
round trip for all of them (docs/decisions/0039-admission-lock-and-async-commit.md)."""

from __future__ import annotations

import asyncio
import weakref

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.driver import fetchrow_pooled

# A transaction that writes WAL (a transactional logical message: no table, no row lock, any
# role may send it) and commits synchronously: its commit flushes the WAL up to its own record.
# A transaction that only takes an xid writes its commit record without a flush.
FLUSH = "SELECT pg_logical_emit_message(true, 'swarm-api', 'flush')"


class WalFlusher:
    """Waiters on one engine's flush: a flush that starts after a waiter arrived covers every
    commit that waiter made before it; waiters who arrive while one is in flight share the
    next."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._next: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.flushes = 0  # flush statements sent (tests, benchmarks)

    async def flushed(self) -> None:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            # nobody left to read a failure (every waiter cancelled): not logged as unread
            self._next.add_done_callback(_read_failure)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
            self._task.add_done_callback(self._ended)
        # shielded: a waiter cancelled does not cancel the flush others share
        await asyncio.shield(self._next)

    async def _run(self) -> None:
        while (waiting := self._next) is not None:
            self._next = None
            try:
                await fetchrow_pooled(self._engine, FLUSH, ())
            except Exception as exc:  # each waiter's request fails with it, as its own would
                waiting.set_exception(exc)
            except BaseException:  # cancelled (the loop shuts down): its waiters with it
                waiting.cancel()
                raise
            else:
                self.flushes += 1
                waiting.set_result(None)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self._task is not task:  # a later one took over, with the waiters left
            return
        self._task = None
        if task.cancelled() and self._next is not None:  # nobody sends for those left
            self._next.cancel()
            self._next = None


def _read_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


_FLUSHERS: weakref.WeakKeyDictionary[AsyncEngine, tuple[asyncio.AbstractEventLoop,
                                                         WalFlusher]] = \
    weakref.WeakKeyDictionary()


def flusher(engine: AsyncEngine) -> WalFlusher:
    """The engine's flusher on the running loop (an engine outlives a test's loop)."""
    loop = asyncio.get_running_loop()
    found = _FLUSHERS.get(engine)
    if found is None or found[0] is not loop:
        found = _FLUSHERS[engine] = (loop, WalFlusher(engine))
    return found[1]


async def flushed(engine: AsyncEngine) -> None:
    """Return once every commit this task has made on `engine` is flushed to disk."""
    await flusher(engine).flushed()
