"""Facade requests that hold a connection open take one of the tenant's `max_streams`, as
`/events` does (SPEC §10): a streaming facade swarm, a waiting non-streaming one and a
passthrough stream. Over the limit -> 429 `quota_exceeded` in OpenAI's shape, nothing created;
a slot frees when its stream ends, its answer comes, or its client disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from app.gateway.client import GatewayClient
from tests.facade.conftest import KEY, Facade, start_facade
from tests.facade.live import serving
from tests.helpers import until

TENANTS = "[tenants.t1]\nmax_streams = 3\n"
SWARM = {"model": "kimi-k2.5",
         "messages": [{"role": "user", "content": "Audit it [[sim latency_ms=2500]]"}],
         "agent_swarm": {"enabled": True, "max_sub_agents": 2,
                         "fan_in_strategy": "concatenate"}}
PLAIN = {"model": "deepseek-v3.2", "max_tokens": 20,
         "messages": [{"role": "user", "content": "Name a risk"}]}


def tenants(tmp_path: Path) -> str:
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS)
    return str(path)


def client(facade: Facade, key: str = KEY) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=facade.base_url, timeout=30,
                             headers={"Authorization": f"Bearer {key}"})


@dataclass
class Opened:
    response: httpx.Response
    lines: AsyncIterator[str]  # what is left of it

    async def rest(self) -> str:
        return "\n".join([line async for line in self.lines])


@asynccontextmanager
async def opened(c: httpx.AsyncClient, body: dict[str, Any]) -> AsyncIterator[Opened]:
    """A streamed request whose first event has arrived (so it holds its slot); leaving the
    block disconnects its client."""
    async with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        lines = r.aiter_lines()
        while not (await anext(lines)).startswith("data:"):
            pass
        yield Opened(r, lines)


def assert_refused(r: httpx.Response) -> None:
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert (error["code"], error["type"]) == ("quota_exceeded", "rate_limit_error")
    assert "streams open" in error["message"]
    assert r.headers["retry-after"] == "1"


async def _swarm_count(facade: Facade) -> int:
    return len((await facade.http.get("/swarms")).json()["items"])


async def test_facade_swarms_hold_a_stream_slot(database_url: str, tmp_path: Path) -> None:
    async with start_facade(database_url, tenants_file=tenants(tmp_path)) as facade, \
            client(facade) as c, AsyncExitStack() as held:
        first = await held.enter_async_context(opened(c, SWARM))
        await held.enter_async_context(opened(c, SWARM))
        waiting = asyncio.create_task(c.post("/v1/chat/completions", json=SWARM))
        async def three() -> bool:
            return await _swarm_count(facade) == 3
        await until(three, 10, "the waiting swarm")  # its slot is taken before its swarm
        swarm_id = first.response.headers["x-swarm-id"]
        # a 4th of any kind is refused, and creates nothing
        assert_refused(await c.post("/v1/chat/completions", json={**SWARM, "stream": True}))
        assert_refused(await c.post("/v1/chat/completions", json=SWARM))
        assert_refused(await c.post("/v1/chat/completions", json={**PLAIN, "stream": True}))
        r = await c.get(f"/swarms/{swarm_id}/events")
        assert r.status_code == 429, r.text  # /events counts the same slots
        assert await _swarm_count(facade) == 3
        # a plain passthrough call holds no stream; another tenant has its own slots
        assert (await c.post("/v1/chat/completions", json=PLAIN)).status_code == 200
        async with client(facade, "k2") as t2:
            r = await t2.post("/v1/chat/completions", json={**PLAIN, "stream": True})
            assert r.status_code == 200 and "[DONE]" in r.text
        # the streams' clients leave: their slots are free (their swarms run on)
        await held.aclose()

        async def accepted() -> bool:
            r = await c.post("/v1/chat/completions", json={**PLAIN, "stream": True})
            return r.status_code == 200
        await until(accepted, 5, "a slot freed by the disconnect")
        assert (await waiting).status_code == 200  # its answer frees its slot too
        async with opened(c, SWARM), opened(c, SWARM), opened(c, SWARM):
            assert_refused(await c.post("/v1/chat/completions", json=SWARM))
        assert (await facade.swarm(swarm_id))["status"] != "cancelled"


class HeldGateway:
    """A gateway whose streams send one event, then wait until the test lets one end
    (`finish`) or the caller goes away; plain calls are answered at once."""

    def __init__(self) -> None:
        self.finish = asyncio.Semaphore(0)
        self.open = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw, more = b"", True
        while more:
            message = await receive()
            raw += message.get("body", b"")
            more = message.get("more_body", False)
        req = json.loads(raw)
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        if not req.get("stream"):
            body = {"id": "c", "object": "chat.completion", "created": 0, "model": req["model"],
                    "usage": usage, "choices": [{"index": 0, "finish_reason": "stop",
                                                 "message": {"role": "assistant",
                                                             "content": "ok"}}]}
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps(body).encode()})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "more_body": True,
                    "body": _event(req, {"role": "assistant", "content": "Hel"})})
        self.open += 1
        try:
            if not await self._finished(receive):
                return
        finally:
            self.open -= 1
        await send({"type": "http.response.body", "more_body": True,
                    "body": _event(req, {"content": "lo"}, "stop")
                    + b"data: " + json.dumps({"id": "c", "object": "chat.completion.chunk",
                                              "created": 0, "model": req["model"],
                                              "choices": [], "usage": usage}).encode()
                    + b"\n\ndata: [DONE]\n\n"})
        await send({"type": "http.response.body", "body": b""})

    async def _finished(self, receive: Receive) -> bool:
        async def gone() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
        told = asyncio.ensure_future(self.finish.acquire())
        left = asyncio.ensure_future(gone())
        done, pending = await asyncio.wait({told, left}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if told in done and left in done:
            self.finish.release()  # nobody to finish: the next one is
        return told in done and left not in done


def _event(req: dict[str, Any], delta: dict[str, str], finish: str | None = None) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": req["model"],
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def test_passthrough_streams_hold_a_stream_slot(sqlite_url: str, tmp_path: Path) -> None:
    gateway_app = HeldGateway()
    async with serving(gateway_app) as gw_url:
        gateway = GatewayClient(f"{gw_url}/v1")
        async with start_facade(sqlite_url, gateway_app=gateway_app, gateway=gateway,
                                tenants_file=tenants(tmp_path)) as facade, \
                client(facade) as c, AsyncExitStack() as held:
            streams = [await held.enter_async_context(opened(c, PLAIN)) for _ in range(3)]
            assert gateway_app.open == 3
            assert_refused(await c.post("/v1/chat/completions", json={**PLAIN, "stream": True}))
            assert_refused(await c.post("/v1/chat/completions", json={**SWARM, "stream": True}))
            assert (await c.post("/v1/chat/completions", json=PLAIN)).status_code == 200
            # one ends (the gateway finishes it, its reader reads to [DONE]): its slot frees
            gateway_app.finish.release()
            assert "[DONE]" in await streams[0].rest()
            async with opened(c, PLAIN):
                assert_refused(await c.post("/v1/chat/completions",
                                            json={**PLAIN, "stream": True}))
            await until(lambda: gateway_app.open == 2, 5, "the 4th stream's end")
            # the clients of the others leave mid-stream: theirs free too
            await held.aclose()
            await until(lambda: gateway_app.open == 0, 5, "the gateway streams closed")
            async with opened(c, PLAIN), opened(c, PLAIN), opened(c, PLAIN):
                assert_refused(await c.post("/v1/chat/completions",
                                            json={**PLAIN, "stream": True}))
