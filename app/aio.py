"""asyncio helpers the standard library lacks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


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
