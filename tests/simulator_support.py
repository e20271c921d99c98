"""The simulated gateway in process for its tests: a client on its ASGI app, one chat call, an
answer's text."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.applications import Starlette

URL = "/v1/chat/completions"


def sim_client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim")


async def chat(
    client: httpx.AsyncClient,
    content: str = "Summarise the quarterly report",
    *,
    key: str | None = None,
    model: str = "kimi-k2.5",
    **extra: Any,
) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    headers = {"Idempotency-Key": key} if key else {}
    return await client.post(URL, json=body, headers=headers)


def content_of(resp: httpx.Response) -> str:
    text = resp.json()["choices"][0]["message"]["content"]
    assert isinstance(text, str)
    return text
