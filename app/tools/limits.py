"""Per-server and per-tool slots where waiting calls are served by priority, then FIFO."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager


class PrioritySemaphore:
    """A semaphore whose waiters are woken highest priority first, ties in arrival order.

    (asyncio.Semaphore wakes in arrival order only.) The engine passes the length of the
    caller's remaining dependency chain as the priority: critical path first.
    """

    def __init__(self, value: int) -> None:
        if value < 1:
            raise ValueError("a semaphore needs at least one slot")
        self._free = value
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for *_, f in self._waiters if not f.done())

    async def acquire(self, priority: int = 0) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (-priority, next(self._arrivals), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted and cancelled at once: pass the slot on
            raise

    def release(self) -> None:
        while self._waiters:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)  # the slot moves straight to the waiter
                return
        self._free += 1


@asynccontextmanager
async def held(*semaphores: PrioritySemaphore, priority: int = 0) -> AsyncIterator[None]:
    """Hold every semaphore, acquired in the given order (always tool, then server: one
    order everywhere, so two calls never wait on each other's slot)."""
    async with AsyncExitStack() as stack:
        for sem in semaphores:
            await sem.acquire(priority)
            stack.callback(sem.release)
        yield
