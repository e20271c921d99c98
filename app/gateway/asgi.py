"""The built-in simulator reached in process, its answers streamed as it sends them.

httpx's own ASGITransport runs the app to its end and hands back the whole body (encode/httpx
#2186; the streaming change, #3059, is not released), so a streamed answer of the embedded
simulator arrived in one piece and token streaming showed nothing until the worker ended. Here
the app runs as a task: the response is returned at `http.response.start` and its body read as
the app sends it; closing the response tells the app the client left.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from app.aio import cancel_and_wait

Message = dict[str, Any]


Pieces = asyncio.Queue[bytes | BaseException | None]  # None: the body is complete


class _Body(httpx.AsyncByteStream):
    def __init__(self, exchange: _Exchange, task: asyncio.Task[None]) -> None:
        self._exchange, self._task = exchange, task

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            piece = await self._exchange.pieces.get()
            if isinstance(piece, BaseException):
                raise httpx.ReadError(f"the in-process gateway failed: {piece!r}") from piece
            if piece is None:
                return
            yield piece

    async def aclose(self) -> None:
        self._exchange.left.set()
        await asyncio.sleep(0)  # the app's receive() sees the disconnect before it is cancelled
        if not self._task.done():
            await cancel_and_wait(self._task)


class _Exchange:
    """One request's ASGI channels: the request body in, the response start and pieces out."""

    def __init__(self, body: bytes) -> None:
        self.body: bytes | None = body
        self.started: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.pieces: Pieces = asyncio.Queue()
        self.left = asyncio.Event()  # the client closed the response

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and not self.started.done():
            self.started.set_result(message)
        elif message["type"] == "http.response.body":
            if chunk := message.get("body", b""):
                self.pieces.put_nowait(chunk)
            if not message.get("more_body", False):
                self.pieces.put_nowait(None)

    async def run(self, app: Any, scope: Message) -> None:
        try:
            await app(scope, self.receive, self.send)
        except Exception as exc:
            if not self.started.done():
                self.started.set_exception(exc)
            else:
                self.pieces.put_nowait(exc)
        finally:
            self.pieces.put_nowait(None)
            if not self.started.done():
                self.started.set_exception(RuntimeError("the app sent no response"))


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """An ASGI app as an httpx transport whose responses stream."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = b"".join([part async for part in request.stream])  # type: ignore[union-attr]
        url = request.url
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": request.method, "scheme": url.scheme, "path": url.path,
            "raw_path": url.raw_path.split(b"?")[0], "query_string": url.query,
            "root_path": "", "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "server": (url.host, url.port or 80), "client": ("127.0.0.1", 0),
        }
        exchange = _Exchange(body)
        task = asyncio.create_task(exchange.run(self.app, scope), name="in-process gateway")
        try:
            start = await exchange.started
        except BaseException:
            exchange.left.set()
            await cancel_and_wait(task)
            raise
        return httpx.Response(start["status"], headers=start.get("headers", []),
                              stream=_Body(exchange, task), request=request)
