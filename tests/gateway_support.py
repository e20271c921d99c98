"""A scripted gateway for GatewayClient's tests (httpx.MockTransport), its fixtures, and the
request and answer shapes they share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from app.gateway.chat import ChatRequest

BASE_URL = "http://gateway.test/v1"
API_KEY = "sk-test-SECRET-0123456789"
REQUEST = ChatRequest(
    model="kimi-k2.5",
    messages=[{"role": "user", "content": "hello"}],
    max_tokens=64,
    idempotency_key="swarm-1:task-a:1",
)

Reply = httpx.Response | Exception | Callable[[httpx.Request], Awaitable[httpx.Response]]


def completion(
    content: str | None = "hi",
    finish_reason: str = "stop",
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage if usage is not None else {"prompt_tokens": 12, "completion_tokens": 3},
    }


def ok_response() -> httpx.Response:
    return httpx.Response(200, json=completion())


class Gateway:
    """A scripted gateway: answers each request with the next reply, recording when it came."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.times.append(time.monotonic())
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, httpx.Response):
            return reply
        return await reply(request)


def raw_answer(status: str, body: bytes, *headers: str, keep_alive: bool = False) -> bytes:
    headers += (f"Content-Length: {len(body)}",) + (() if keep_alive else ("Connection: close",))
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\n{head}\r\n".encode("latin-1") + body


class ScriptedServer:
    """A real HTTP/1.1 server writing each request's planned bytes (None: never answers),
    counting connections and the most requests it held at once; `close` ends each connection
    after its answer (one that promised more than it sent is cut short there)."""

    def __init__(self, *answers: bytes | None, close: bool = False) -> None:
        self.answers = list(answers)
        self.close = close
        self.connections = 0
        self.requests = 0
        self.held = 0
        self.most_held = 0
        self.release = asyncio.Event()
        self.release.set()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                answer = self.answers[min(self.requests, len(self.answers) - 1)]
                self.requests += 1
                self.held += 1
                self.most_held = max(self.most_held, self.held)
                await self.release.wait()
                self.held -= 1
                if answer is None:
                    await asyncio.sleep(30)
                    return
                writer.write(answer)
                await writer.drain()
                if self.close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def sleep_forever(request: httpx.Request) -> httpx.Response:
    """A gateway that never answers in time: the attempt's timeout ends it."""
    await asyncio.sleep(30)
    raise AssertionError("the attempt should have timed out")
