"""A scripted gateway for GatewayClient's tests (httpx.MockTransport), its fixtures, and the
request and answer shapes they share."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from app.gateway.client import ChatRequest

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
