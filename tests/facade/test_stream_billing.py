"""A passthrough stream that reported no usage is billed at a bound, and counted as one: a
stream cut before `[DONE]` at the text it carried, a stream its caller left at the request's
`max_tokens` (the gateway generates on until it notices) — both in `unresolved_usd` and the
unresolved metric, never as settled money (SQLite)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from app.gateway.client import GatewayClient
from app.main import create_app
from tests.conftest import make_settings
from tests.facade.conftest import start_facade
from tests.facade.live import serving

MODEL = "deepseek-v3.2"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
        "stream": True}
CHUNK = json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                    "model": MODEL, "choices": [{"index": 0, "delta": {"content": "Hello"}}]})


def sse(*events: str) -> bytes:
    return b"".join(f"data: {e}\n\n".encode() for e in events)


def unresolved_metric() -> float:
    return REGISTRY.get_sample_value("swarm_spend_unresolved_usd_total", {"model": MODEL}) or 0.0


async def torn(_: Request) -> Response:
    """Text, no usage, no [DONE]."""
    return StreamingResponse(iter([sse(CHUNK, CHUNK)]), media_type="text/event-stream")


async def long(_: Request) -> Response:
    """Twenty chunks, then its usage: generating (and billing) until it sees the caller gone."""
    async def events() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield sse(CHUNK)
            await asyncio.sleep(0.05)
        yield sse(json.dumps({"choices": [], "usage": {"prompt_tokens": 12,
                                                         "completion_tokens": 45}}), "[DONE]")
    return StreamingResponse(events(), media_type="text/event-stream")


def gateway(handler: Any) -> Starlette:
    return Starlette(routes=[Route("/v1/chat/completions", handler, methods=["POST"])])


async def test_a_stream_cut_before_done_is_unresolved_at_its_text(sqlite_url: str) -> None:
    before = unresolved_metric()
    async with start_facade(sqlite_url, gateway_app=gateway(torn)) as f:
        async with f.http.stream("POST", "/v1/chat/completions", json=CHAT) as r:
            assert r.status_code == 200
            text = (await r.aread()).decode()
        assert "before [DONE]" in text
        total = (await f.usage())["total"]
    cost = Decimal(total["cost_usd"])
    assert cost > 0 and total["gateway_calls"] == 1  # billed: the text was generated
    assert total["completion_tokens"] == 2 * len("Hello")  # a byte a token: what it carried
    assert Decimal(total["unresolved_usd"]) == cost and Decimal(total["settled_usd"]) == 0
    assert unresolved_metric() - before == pytest.approx(float(cost), abs=1e-12)


async def test_a_stream_its_caller_left_is_billed_its_max_tokens(sqlite_url: str) -> None:
    async with serving(gateway(long)) as gw_url:  # real HTTP: ASGITransport buffers streams
        client = GatewayClient(f"{gw_url}/v1")
        app = create_app(make_settings(sqlite_url, api_keys="t1:k1"), gateway=client)
        try:
            async with serving(app) as url, httpx.AsyncClient(
                    base_url=url, headers={"Authorization": "Bearer k1"}, timeout=30) as http:
                async with http.stream("POST", "/v1/chat/completions", json=CHAT) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            break  # the caller leaves after the first chunk
                for _ in range(100):
                    total = (await http.get("/usage")).json()["total"]
                    if total["gateway_calls"]:
                        break
                    await asyncio.sleep(0.05)
        finally:
            await client.aclose()
    assert total["gateway_calls"] == 1
    assert total["completion_tokens"] == 50, total  # not the 5 bytes relayed
    assert Decimal(total["unresolved_usd"]) == Decimal(total["cost_usd"]) > 0
