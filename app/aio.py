"""asyncio helpers the standard library lacks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
U = TypeVar("U")


async def run_to_end(aw: Awaitable[T]) -> T:
    """Await `aw` to its end even when the caller is cancelled meanwhile, then raise the
    cancellation. `asyncio.shield` alone lets the cancelled caller go on while `aw` still
    runs: whoever awaited the caller (a swarm's end gathering its subtasks) would go on
    before `aw`'s writes are done."""
    task = asyncio.ensure_future(aw)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():  # `aw` itself was cancelled (or the loop is closing)
                raise
            cancelled = True  # the caller was: wait on
        else:
            break
    if cancelled:
        raise asyncio.CancelledError
    return result


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:
    """`asyncio.wait_for` as Python 3.12 rebuilt it, on `asyncio.timeout`: 3.11's drops a
    cancellation that arrives as `aw` ends (gh-86296), and a loop that waits on an event this
    way goes on forever in a task its owner cancelled to stop it."""
    async with asyncio.timeout(timeout):
        return await aw


async def woken(event: asyncio.Event, timeout: float) -> bool:
    """Wait for an armed event: True when it fired, False after `timeout` seconds."""
    with contextlib.suppress(TimeoutError):
        await wait_for(event.wait(), timeout)
        return True
    return False


async def cancel_and_wait(task: asyncio.Task[T]) -> None:
    """Cancel a background task and wait until it has stopped (its own cancellation is not
    an error to its owner)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def alongside(coro: Coroutine[Any, Any, T], work: Callable[[], U]) -> tuple[T, U]:
    """`coro` as a task whose first step runs first (up to its first real wait: a statement
    built and sent to the database), `work` done in this task meanwhile, then both results:
    CPU spent while the database works, not after it answered. A failure or cancellation of
    `work` cancels the task, as a cancelled await of it would."""
    task = asyncio.ensure_future(coro)
    try:
        await asyncio.sleep(0)  # the task's first step was scheduled before this one's resumption
        done = work()
    except BaseException:
        task.cancel()
        raise
    return await task, done


class Within:
    """`asyncio.timeout(delay)` for a block whose deadline never moves: the task is cancelled
    when `delay` runs out, and that cancellation leaves the block as TimeoutError; any other
    cancellation stays one. One timer handle and no state machine: the standard one's
    rescheduling and states are paid on every gateway attempt of the engine's hot path."""

    __slots__ = ("_cancelling", "_delay", "_fired", "_handle", "_task")

    def __init__(self, delay: float) -> None:
        self._delay = delay
        self._fired = False

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Within must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._handle = asyncio.get_running_loop().call_later(self._delay, self._fire)

    def _fire(self) -> None:
        self._fired = True
        self._task.cancel()

    def expired(self) -> bool:
        """The delay ran out (as `asyncio.Timeout.expired`): a TimeoutError out of the block
        was this timer's, not one raised inside it."""
        return self._fired

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: object) -> None:
        self._handle.cancel()
        # as asyncio.timeout: its own cancellation is taken back whatever the block raised
        if (self._fired and self._task.uncancel() <= self._cancelling
                and exc_type is asyncio.CancelledError):
            raise TimeoutError from exc
