"""A connection pool that serves waiters first come, first served."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

from sqlalchemy import exc
from sqlalchemy.pool import AsyncAdaptedQueuePool, ConnectionPoolEntry
from sqlalchemy.util import await_only


class Turnstile:
    """`n` turns handed out in arrival order: a turn given back goes straight to the oldest
    waiter (never back into a pile a newcomer could take it from). `asyncio.Semaphore` is FIFO
    too, but a turn taken without waiting still costs a coroutine (here: a greenlet switch per
    checkout), which cost 9 to 12 % of creation throughput.

    The waiters' timeouts share one timer, armed for the earliest deadline: under load every
    checkout waits, and a timer of its own (`asyncio.timeout`: a timer scheduled, rescheduled
    and cancelled a waiter) costs twice the rest of a waiting turn
    (docs/decisions/0037-creation-cpu.md). One pool asks with one timeout, so the deadlines
    follow the waiters' order and the timer fires about once a timeout while waiters come
    and go."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiting: deque[tuple[float, asyncio.Future[None]]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None  # a closed one's never fires

    def try_take(self) -> bool:
        if self._free and not self._waiting:
            self._free -= 1
            return True
        return False

    async def take(self, timeout: float) -> None:
        """A turn, after the waiters before this one; `TimeoutError` after `timeout` s."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        deadline = loop.time() + timeout
        entry = (deadline, fut)
        self._waiting.append(entry)
        if self._timer is None or self._timer_loop is not loop or self._timer.when() > deadline:
            self._arm(loop, deadline)
        try:
            await fut
        except BaseException:
            if fut.cancelled():
                with contextlib.suppress(ValueError):  # gone already if a give passed it by
                    self._waiting.remove(entry)
            elif fut.exception() is None:  # handed a turn while leaving: pass it on
                self.give()
            raise

    def give(self) -> None:
        while self._waiting:
            _, fut = self._waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1

    def _arm(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_loop = loop.call_at(deadline, self._expire, loop), loop

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fail the waiters whose deadline passed; arm the timer for the next deadline."""
        self._timer = None
        now, left = loop.time(), deque[tuple[float, asyncio.Future[None]]]()
        for deadline, fut in self._waiting:
            if fut.done():
                continue
            if deadline <= now:
                fut.set_exception(TimeoutError())
            else:
                left.append((deadline, fut))
        self._waiting = left
        if left:
            self._arm(loop, min(deadline for deadline, _ in left))


class FairQueuePool(AsyncAdaptedQueuePool):
    """SQLAlchemy's async queue pool behind a FIFO turnstile.

    The async pool waits on an `asyncio.Queue`, which lets a newcomer take the connection just
    handed to a woken waiter; that waiter queues again at the back. With more requests than
    connections, a few of them lose that race over and over, and the tail grows to several
    times the median (docs/decisions/0005-fair-connection-pool.md). Every checkout here first
    takes a turn, sized to the pool's whole capacity, so the queue underneath never makes
    anyone wait, and a connection goes to whoever asked first.
    """

    def __init__(self, creator: Any, pool_size: int = 5, max_overflow: int = 10,
                 timeout: float = 30.0, **kw: Any) -> None:
        super().__init__(creator, pool_size=pool_size, max_overflow=max_overflow,
                         timeout=timeout, **kw)
        self._turns = Turnstile(pool_size + max(max_overflow, 0))

    def _do_get(self) -> ConnectionPoolEntry:
        if not self._turns.try_take():
            try:
                await_only(self._turns.take(self._timeout))
            except TimeoutError:
                raise exc.TimeoutError(
                    f"connection pool of {self.size()} + {self._max_overflow} overflow busy "
                    f"for {self._timeout:.2f} s") from None
        try:
            return super()._do_get()
        except BaseException:
            self._turns.give()
            raise

    def _do_return_conn(self, record: ConnectionPoolEntry) -> None:
        try:
            super()._do_return_conn(record)
        finally:
            self._turns.give()
