"""The in-process gateway transport (app/gateway/asgi.py): a response streams as the app sends
it, closing it tells the app the client left, an app that fails before answering raises."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.aio import wait_for
from app.gateway.asgi import StreamingASGITransport

Scope = dict[str, Any]


def paced(gate: asyncio.Event, seen: list[str]) -> Any:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        request = await receive()
        seen.append(f"{scope['method']} {scope['path']}?{scope['query_string'].decode()} "
                    f"{request['body'].decode()}")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await gate.wait()
        await send({"type": "http.response.body", "body": b"second", "more_body": False})
    return app


async def test_a_response_streams_as_the_app_sends_it() -> None:
    gate, seen = asyncio.Event(), []
    async with httpx.AsyncClient(transport=StreamingASGITransport(paced(gate, seen)),
                                 base_url="http://sim") as client, client.stream(
            "POST", "/v1/x?a=1", content=b"body") as r:
        pieces = r.aiter_bytes()
        assert r.status_code == 200 and await anext(pieces) == b"first"  # before the end
        gate.set()
        assert [p async for p in pieces] == [b"second"]
    assert seen == ["POST /v1/x?a=1 body"]


async def test_closing_the_response_is_the_clients_disconnect() -> None:
    left = asyncio.Event()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        if (await receive())["type"] == "http.disconnect":
            left.set()
            await asyncio.sleep(3600)  # cancelled by the close

    async with httpx.AsyncClient(transport=StreamingASGITransport(app)) as client:
        async with client.stream("GET", "http://sim/") as r:
            assert await anext(r.aiter_bytes()) == b"x"
        await wait_for(left.wait(), 5)


async def test_an_app_that_fails_before_answering_raises() -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async with httpx.AsyncClient(transport=StreamingASGITransport(app)) as client:
        with pytest.raises(RuntimeError, match="boom"):
            await client.get("http://sim/")
