"""The streamable-HTTP transport on aiohttp (app/tools/http_transport.py) against a scripted
server that answers as the transport spec allows: JSON or an SSE stream (a notification before
the answer), the session id from `initialize` and the protocol version on later requests, the
server's own notices on the GET stream, a forgotten session (404), a POST that breaks (only its
call fails), DELETE at the end; and a call is not preceded by a listing on a session that has
not listed the tools (the SDK's `call_tool` lists them to check each result's structured
content)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
from aiohttp import web
from mcp.shared.exceptions import MCPError

from app.tools.config import ServerConfig
from app.tools.registry import ToolRegistry
from app.tools.transports import open_session
from tests.mcp_servers import free_port

TOOL = {"name": "echo", "inputSchema": {"type": "object"}}


class Scripted:
    """An MCP server over streamable HTTP, by hand: what it was asked, by which session."""

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, str, dict[str, str]]] = []  # (session, method, hdrs)
        self.forgotten: set[str] = set()
        self.deleted: list[str] = []
        self.sessions = 0
        self.notice = asyncio.Event()  # set: the GET stream sends tools/list_changed
        self.url = ""

    async def post(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        sid = request.headers.get("mcp-session-id")
        self.seen.append((sid, body["method"], {k.lower(): v for k, v in request.headers.items()}))
        if sid in self.forgotten:
            return web.Response(status=404)
        if "id" not in body:
            return web.Response(status=202)
        method, rid = body["method"], body["id"]
        if method == "initialize":
            self.sessions += 1
            return web.json_response(self.answer(rid, {
                "protocolVersion": body["params"]["protocolVersion"],
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "scripted", "version": "1"}}),
                headers={"mcp-session-id": f"s{self.sessions}"})
        if method == "tools/list":
            return web.json_response(self.answer(rid, {"tools": [TOOL]}))
        if method != "tools/call":
            return web.json_response(self.answer(rid, {}))
        text = body["params"]["arguments"].get("text", "")
        if text == "break":  # the connection drops mid-answer
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=200)
        if text == "slow":
            await asyncio.sleep(0.3)
        result = self.answer(rid, {"content": [{"type": "text", "text": f"echo {text}"}]})
        if text != "sse":
            return web.json_response(result)
        stream = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await stream.prepare(request)
        log = {"jsonrpc": "2.0", "method": "notifications/message",
               "params": {"level": "info", "data": "working"}}
        for message in (log, result):
            await stream.write(f"event: message\nid: e1\ndata: {json.dumps(message)}\n\n"
                               .encode())
        return stream

    async def get(self, request: web.Request) -> web.StreamResponse:
        stream = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await stream.prepare(request)
        await self.notice.wait()
        changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        await stream.write(f": a comment\ndata: {json.dumps(changed)}\n\n".encode())
        await asyncio.sleep(30)
        return stream

    async def delete(self, request: web.Request) -> web.Response:
        self.deleted.append(request.headers["mcp-session-id"])
        return web.Response(status=200)

    @staticmethod
    def answer(rid: Any, result: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": rid, "result": result}


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    server = Scripted()
    app = web.Application()
    app.router.add_post("/mcp", server.post)
    app.router.add_get("/mcp", server.get)
    app.router.add_delete("/mcp", server.delete)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    server.url = f"http://127.0.0.1:{port}/mcp"
    try:
        yield server
    finally:
        await runner.cleanup()


@asynccontextmanager
async def session_with(server: Scripted, heard: list[Any]) -> AsyncIterator[Any]:
    async def on_message(message: Any) -> None:
        heard.append(message)

    config = ServerConfig(url=server.url, headers={"authorization": "Bearer t"})
    async with AsyncExitStack() as stack:
        yield await open_session(stack, config, on_message)


async def test_json_and_sse_answers_session_headers_notices_and_delete(
        scripted: Scripted) -> None:
    heard: list[Any] = []
    async with session_with(scripted, heard) as session:
        plain, streamed = await asyncio.gather(session.call_tool("echo", {"text": "a"}),
                                               session.call_tool("echo", {"text": "sse"}))
        assert [b.text for b in plain.content] == ["echo a"]  # type: ignore[union-attr]
        assert [b.text for b in streamed.content] == ["echo sse"]  # type: ignore[union-attr]
        scripted.notice.set()
        async with asyncio.timeout(5):
            while not any(isinstance(m, types.ToolListChangedNotification) for m in heard):
                await asyncio.sleep(0.01)
    assert scripted.deleted == ["s1"]
    first, *later = scripted.seen
    assert first[1] == "initialize" and first[0] is None
    assert "mcp-protocol-version" not in first[2]
    calls = [h for sid, method, h in later if method == "tools/call"]
    assert len(calls) == 2 and all(sid == "s1" for sid, *_ in later)
    for headers in calls:
        assert headers["mcp-protocol-version"] == "2025-11-25"
        assert headers["authorization"] == "Bearer t"
        assert "text/event-stream" in headers["accept"]


async def test_a_broken_post_fails_its_call_alone(scripted: Scripted) -> None:
    heard: list[Any] = []
    async with session_with(scripted, heard) as session:
        slow = asyncio.create_task(session.call_tool("echo", {"text": "slow"}))
        with pytest.raises(MCPError):
            await session.call_tool("echo", {"text": "break"})
        assert any(isinstance(m, Exception) for m in heard)  # the owner hears: it pings
        assert [b.text for b in (await slow).content] == ["echo slow"]  # type: ignore[union-attr]
        again = await session.call_tool("echo", {"text": "b"})
        assert [b.text for b in again.content] == ["echo b"]  # type: ignore[union-attr]


async def test_a_forgotten_session_answers_session_terminated(scripted: Scripted) -> None:
    async with session_with(scripted, []) as session:
        scripted.forgotten.add("s1")
        with pytest.raises(MCPError, match="Session terminated"):
            await session.send_ping()


async def test_calls_on_new_pool_sessions_list_no_tools(scripted: Scripted) -> None:
    tools = ToolRegistry({"s": ServerConfig(url=scripted.url, max_concurrency=12)},
                         http_sessions=3)
    await tools.start()
    try:
        outcomes = await asyncio.gather(*(tools.call("s", "echo", {"text": "slow"})
                                          for _ in range(12)))
        assert [o.status for o in outcomes] == ["ok"] * 12
    finally:
        await tools.stop()
    listings = Counter(sid for sid, method, _ in scripted.seen if method == "tools/list")
    served = {sid for sid, method, _ in scripted.seen if method == "tools/call"}
    assert len(served) > 1 and "s1" not in served  # the pool's sessions, not the listing one
    assert listings == {"s1": 1}
