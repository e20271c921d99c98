"""aiohttp's request bytes written in the caller's step on Python 3.11, as on 3.12+.

aiohttp buffers a request's headers to send them with its body, and writes that body in a task
of its own: started eagerly (`eager_start=True`) on Python 3.12+, but on 3.11 scheduled behind
every callback already ready. When a wave of calls starts at once (the first wave of a
fan-out, released by one commit), no byte leaves until every call's own step has run, so the
gateway receives the wave in one burst at its end and works through it serially
(docs/decisions/0007-request-bytes-leave-in-their-step.md). This task factory starts that one
coroutine eagerly, as 3.12's `Task(eager_start=True)` does: its first step runs now, in the
task's context, and a writer that finishes at once (a body under the transport's buffer limit,
the common case) never becomes a task. (Unlike 3.12's, that
first step sees the caller as `current_task()`; aiohttp's writer never asks.) Every other
coroutine is left to the factory that was there.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from aiohttp.client_reqrep import ClientRequest

# the coroutine aiohttp starts as a task for a request's body (and its buffered headers); a
# release that renames it is simply no longer matched (its bytes then leave a turn later again)
_BODY_WRITER = ClientRequest.write_bytes.__code__
NEEDED = sys.version_info < (3, 12)


class _Rest:
    """The rest of a coroutine whose first step already ran and yielded `first` (the future
    it waits on): the task running this awaits that future, then drives the coroutine on,
    passing in what is sent and thrown (a cancellation) as awaiting it directly would."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro, self._first = coro, first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, waiting = self._coro, self._first
        while True:
            try:
                sent = yield waiting
            except BaseException as exc:  # thrown in by the task: into the coroutine
                try:
                    waiting = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    waiting = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _finish(rest: _Rest) -> Any:
    return await rest


def _done(loop: asyncio.AbstractEventLoop, result: Any = None,
          exc: BaseException | None = None) -> asyncio.Future[Any]:
    # what aiohttp is handed instead of a task that would be done already: it reads `done()`
    # and drops it, as it drops an eager task that finished on 3.12+
    fut = loop.create_future()
    if isinstance(exc, asyncio.CancelledError):
        fut.cancel()
    elif exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
    return fut


class EagerBodyWrites:
    """The loop's task factory: aiohttp's body writer started eagerly, any other coroutine
    handed to the factory that was installed before (or made a plain task)."""

    def __init__(self, previous: Callable[..., asyncio.Future[Any]] | None) -> None:
        self.previous = previous

    def __call__(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
                 ) -> asyncio.Future[Any]:
        if getattr(coro, "cr_code", None) is not _BODY_WRITER:
            if self.previous is not None:
                return self.previous(loop, coro, **kwargs)
            return asyncio.Task(coro, loop=loop, **kwargs)
        context = kwargs.pop("context", None) or contextvars.copy_context()
        try:
            first = context.run(coro.send, None)
        except StopIteration as stop:
            return _done(loop, stop.value)
        except (KeyboardInterrupt, SystemExit):
            raise  # as a task's step re-raises them
        except BaseException as exc:  # the task's outcome, kept as a task keeps it
            return _done(loop, exc=exc)
        return asyncio.Task(_finish(_Rest(coro, first)), loop=loop, context=context, **kwargs)


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Start aiohttp's request writers eagerly on this loop (Python 3.11; 3.12+ does it)."""
    current = loop.get_task_factory()
    if not NEEDED or isinstance(current, EagerBodyWrites):
        return
    loop.set_task_factory(EagerBodyWrites(current))
