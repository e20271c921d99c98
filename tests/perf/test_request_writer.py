"""aiohttp's request bytes leave in the caller's step (app/gateway/request_writer.py): on a real
socket, and the task factory's semantics (a writer that finishes at once, one that waits, cancelled,
failing; every other coroutine left to the factory that was there)."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

import pytest
import uvloop

from app.gateway import request_writer
from app.gateway.wire import AiohttpWire

pytestmark = pytest.mark.skipif(not request_writer.NEEDED, reason="Python 3.12+ starts it eagerly")

ANSWER = json.dumps({"choices": [{"message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}]}).encode()


class _Gateway(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the second call reuses the pooled connection

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.bodies.append(hashlib.sha256(body).hexdigest())  # type: ignore[attr-defined]
        self.server.received.release()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *args: Any) -> None:
        pass


class Gateway(NamedTuple):
    url: str
    received: threading.Semaphore  # released once per request read whole
    bodies: list[str]  # the sha256 of each request body, in the order read


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    """A gateway in a thread of its own: it reads what reaches the socket whatever the test's
    event loop is doing."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    server.received = threading.Semaphore(0)  # type: ignore[attr-defined]
    server.bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Gateway(f"http://127.0.0.1:{server.server_port}/v1/chat/completions",
                      server.received, server.bodies)  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
async def restored_factory() -> AsyncIterator[asyncio.AbstractEventLoop]:
    loop = asyncio.get_running_loop()
    before = loop.get_task_factory()
    try:
        yield loop
    finally:
        loop.set_task_factory(before)


def _wire(url: str) -> AiohttpWire:
    return AiohttpWire(url, {}, limit=4, keepalive_s=30, connect_timeout_s=5,
                       ssl_context=ssl.create_default_context)


async def _bytes_leave_in_the_calls_step(gateway: Gateway, eager_writes: bool = True,
                                        wait_s: float = 2) -> list[bool]:
    """Whether a call's bytes reached the gateway within `wait_s`, checked right after the
    call's first step (`eager_writes=False`: with the factory taken away again)."""
    loop = asyncio.get_running_loop()
    before = loop.get_task_factory()
    wire = _wire(gateway.url)
    try:
        assert (await wire.post(b"{}", None, 5)).status == 200  # warm: a pooled connection
        assert gateway.received.acquire(timeout=5)
        if not eager_writes:
            loop.set_task_factory(before)  # the wire installed it
        seen: list[bool] = []
        call = asyncio.create_task(wire.post(b'{"model": "m"}', None, 5))
        # runs right after the call's first step and before anything that step scheduled: a
        # body writer left to a task of its own would not have written a byte yet
        loop.call_soon(lambda: seen.append(gateway.received.acquire(timeout=wait_s)))
        assert (await call).status == 200
        return seen
    finally:
        await wire.aclose()
        loop.set_task_factory(before)


async def test_a_calls_bytes_reach_the_gateway_before_the_loop_runs_anything_else(
        gateway: Gateway) -> None:
    assert await _bytes_leave_in_the_calls_step(gateway) == [True]


def test_the_same_on_uvloop(gateway: Gateway) -> None:
    """What `serve` runs on."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(_bytes_leave_in_the_calls_step(gateway)) == [True]


async def test_without_it_the_bytes_wait_for_the_next_turn_of_the_loop(gateway: Gateway) -> None:
    """The control: what the factory is for (aiohttp's own behaviour on Python 3.11)."""
    assert await _bytes_leave_in_the_calls_step(gateway, eager_writes=False,
                                                wait_s=0.3) == [False]


async def test_a_body_past_the_transports_buffer_is_written_whole(gateway: Gateway) -> None:
    """Its writer waits for the transport to drain (the part that goes on as a task): a
    prompt of megabytes arrives intact, beside small calls started with it."""
    wire = _wire(gateway.url)
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 8_000_000}]}).encode()
    small = [json.dumps({"n": i}).encode() for i in range(8)]
    try:
        answers = await asyncio.gather(*(wire.post(b, None, 30) for b in [big, *small]))
        assert [a.status for a in answers] == [200] * 9
        assert sorted(gateway.bodies) == sorted(hashlib.sha256(b).hexdigest()
                                                for b in [big, *small])
    finally:
        await wire.aclose()


# ---- the factory, on coroutines standing in for aiohttp's body writer ---------------------

@pytest.fixture
def as_writer(monkeypatch: pytest.MonkeyPatch,
              restored_factory: asyncio.AbstractEventLoop
              ) -> Callable[[Callable[..., Any]], None]:
    def make(fn: Callable[..., Any]) -> None:
        monkeypatch.setattr(request_writer, "_BODY_WRITER", fn.__code__)
        restored_factory.set_task_factory(None)
        request_writer.install(restored_factory)
    return make


async def test_a_writer_that_finishes_at_once_never_becomes_a_task(
        as_writer: Callable[[Callable[..., Any]], None]) -> None:
    log: list[str] = []

    async def writer() -> int:
        log.append("wrote")
        return 7

    as_writer(writer)
    task = asyncio.create_task(writer())
    assert log == ["wrote"]  # before this test's step ended
    assert task.done() and not isinstance(task, asyncio.Task)
    assert await task == 7


async def test_a_writer_that_waits_goes_on_as_a_task(
        as_writer: Callable[[Callable[..., Any]], None]) -> None:
    log: list[str] = []
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def writer() -> str:
        log.append("headers")
        got = await gate  # a transport paused for backpressure, say
        log.append(got)
        await asyncio.sleep(0)
        return "done"

    as_writer(writer)
    task = asyncio.create_task(writer())
    assert log == ["headers"] and isinstance(task, asyncio.Task) and not task.done()
    gate.set_result("body")
    assert await task == "done"
    assert log == ["headers", "body"]


async def test_a_waiting_writer_cancelled_sees_the_cancellation(
        as_writer: Callable[[Callable[..., Any]], None]) -> None:
    log: list[str] = []

    async def writer() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            log.append("cancelled")
            raise

    as_writer(writer)
    task = asyncio.create_task(writer())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["cancelled"] and task.cancelled()


async def test_a_writer_that_fails_at_once_keeps_its_exception(
        as_writer: Callable[[Callable[..., Any]], None]) -> None:
    async def writer() -> None:
        raise OSError("reset")

    async def cancelled() -> None:
        raise asyncio.CancelledError

    as_writer(writer)
    task = asyncio.create_task(writer())
    assert task.done()
    with pytest.raises(OSError, match="reset"):
        await task
    as_writer(cancelled)
    assert asyncio.create_task(cancelled()).cancelled()


async def test_the_eager_step_runs_in_the_tasks_own_context(
        as_writer: Callable[[Callable[..., Any]], None]) -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="caller")

    async def writer() -> str:
        var.set("writer")
        await asyncio.sleep(0)
        return var.get()

    as_writer(writer)
    assert await asyncio.create_task(writer()) == "writer"
    assert var.get() == "caller"


async def test_other_coroutines_go_to_the_factory_installed_before(
        restored_factory: asyncio.AbstractEventLoop) -> None:
    made: list[str] = []

    def previous(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
                 ) -> asyncio.Future[Any]:
        made.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def anything() -> int:
        return 1

    restored_factory.set_task_factory(previous)
    request_writer.install(restored_factory)
    request_writer.install(restored_factory)  # once: a second install keeps the first
    factory = restored_factory.get_task_factory()
    assert isinstance(factory, request_writer.EagerBodyWrites) and factory.previous is previous
    assert await asyncio.create_task(anything()) == 1
    assert made == [anything.__qualname__]
