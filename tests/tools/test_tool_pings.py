"""A session's watcher pings its MCP server once a second while the session is idle, and not
while calls on it are answered (an answer says what a ping would): over stdio (the server's one
session) and over a pooled streamable-HTTP session; a call that fails below the protocol has its
session pinged at once. The example server as a real process."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession

from app.states import ToolCallStatus
from app.tools.registry import ToolRegistry
from tests.mcp_servers import http_server, registry, stdio_server

BUSY_S = 3.0
IDLE_S = 3.5  # the first wake-up after the last answer may be within its second


@pytest.fixture
def pings(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Pings sent, by the id of the session that sent them."""
    sent: Counter[int] = Counter()
    original = ClientSession.send_ping

    async def counted(self: ClientSession, *args: Any, **kwargs: Any) -> Any:
        sent[id(self)] += 1
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(ClientSession, "send_ping", counted)
    return sent


def calling_session(tools: ToolRegistry) -> ClientSession:
    """The session the server's calls go over: the pool's one member, or the connection's."""
    conn = tools.connections["s"]
    if conn.pool is None:
        session = conn._session
    else:
        [member] = conn.pool._members
        session = member.session
    assert session is not None
    return session


async def busy_then_idle(tools: ToolRegistry, pings: Counter[int]) -> tuple[int, int]:
    """(pings of the calling session while a call is answered every 0.1 s for BUSY_S, its
    pings over the IDLE_S after)."""
    outcome = await tools.call("s", "sleep", {"seconds": 0.01})
    assert outcome.status == ToolCallStatus.ok, outcome.text
    session = id(calling_session(tools))
    before = pings[session]
    end = time.monotonic() + BUSY_S
    while time.monotonic() < end:
        assert (await tools.call("s", "sleep", {"seconds": 0.01})).status == ToolCallStatus.ok
        await asyncio.sleep(0.1)
    busy = pings[session] - before
    await asyncio.sleep(IDLE_S)
    return busy, pings[session] - before - busy


async def test_a_busy_stdio_session_is_not_pinged(tmp_path: Path, pings: Counter[int]) -> None:
    async with registry(stdio_server(tmp_path / "calls.log"), http_sessions=1) as tools:
        busy, idle = await busy_then_idle(tools, pings)
    # a stall of the loop past a second may let one through; the watcher pinged every second
    assert busy <= 1 and idle >= 2, (busy, idle)


async def test_a_busy_pooled_session_is_not_pinged(tmp_path: Path, pings: Counter[int]) -> None:
    async with http_server(tmp_path / "calls.log") as server, registry(
            {"url": server.url}, http_sessions=2) as tools:
        busy, idle = await busy_then_idle(tools, pings)
        listing = tools.connections["s"]._session
        assert listing is not None and pings[id(listing)] >= BUSY_S  # it carries no calls
    assert busy <= 1 and idle >= 2, (busy, idle)


async def test_a_failed_call_has_its_session_pinged_at_once(tmp_path: Path,
                                                            pings: Counter[int]) -> None:
    async with registry(stdio_server(tmp_path / "calls.log"), http_sessions=1) as tools:
        conn = tools.connections["s"]
        # answered: no ping for a second, unless poked
        assert (await tools.call("s", "sleep", {"seconds": 0.01})).status == ToolCallStatus.ok
        session = calling_session(tools)
        before = pings[id(session)]
        with pytest.raises(RuntimeError):
            async with conn.lease(5):
                raise RuntimeError("below the protocol")
        async with asyncio.timeout(0.5):
            while pings[id(session)] == before:
                await asyncio.sleep(0.01)
