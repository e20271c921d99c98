"""Group commit: the state writes of every runner in this process, one transaction per tick."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from app.db.queries import LeaseLost, SwarmWrite, apply_writes
from app.db.retry import database_unavailable, in_transaction
from app.db.session import SessionFactory

log = logging.getLogger(__name__)

Pending = tuple[SwarmWrite, asyncio.Future[None]]


class StateWriter:
    """Collects writes while a transaction runs and commits them together in the next one.

    A write's future resolves only after its commit, so a subtask counts as done only once
    durable; batching costs milliseconds of latency, never durability.
    """

    def __init__(self, sessions: SessionFactory, owner: str, *, retry_for_s: float = 15.0,
                 max_batch: int = 500, on_commit: Callable[[str], None] | None = None) -> None:
        self._sessions = sessions
        self._on_commit = on_commit
        self._owner = owner
        self._retry_for_s = retry_for_s
        self._max_batch = max_batch
        self._queue: list[Pending] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def sessions(self) -> SessionFactory:
        """For the engine's few reads (a transcript after a takeover)."""
        return self._sessions

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="state-writer")

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    def submit(self, write: SwarmWrite) -> asyncio.Future[None]:
        """Queue a write; await the future for durability (or LeaseLost)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._closing and self._task is None:
            fut.set_exception(RuntimeError("state writer closed"))
            return fut
        self._queue.append((write, fut))
        self._wake.set()
        return fut

    async def close(self) -> None:
        """Flush what is queued, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch:]
                await self._commit(batch)
            if self._closing and not self._queue:
                return

    async def _commit(self, batch: list[Pending]) -> None:
        writes = [w for w, _ in batch]
        try:
            # a database restart or outage is retried until the lease would have expired
            # anyway; the batch is idempotent (inserts ignore rows already there), so a retry
            # after a COMMIT whose outcome was lost duplicates nothing
            fenced = await in_transaction(
                self._sessions,
                lambda session: apply_writes(session, self._owner, writes,
                                             lease_s=self._retry_for_s),
                retry_for_s=self._retry_for_s)
        except Exception as exc:
            log.error("state write failed for good: %s", exc,
                      exc_info=not database_unavailable(exc))
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(LeaseLost(f"state write failed: {exc}"))
            return
        for write, fut in batch:
            if fut.done():
                continue
            if write.swarm_id in fenced:
                fut.set_exception(LeaseLost(write.swarm_id))
            else:
                fut.set_result(None)
        if self._on_commit is not None:
            for swarm_id in {w.swarm_id for w in writes} - fenced:
                self._on_commit(swarm_id)


def consume(fut: asyncio.Future[None]) -> None:
    """Done-callback for writes nobody awaits: mark their exception retrieved."""
    if not fut.cancelled():
        fut.exception()
