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
