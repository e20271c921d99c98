"""Tool turns against a model and tool servers that misbehave (SQLite and PostgreSQL): tools that
expand to nothing, tool text no database stores, call ids that repeat or are too long — each
gives its subtask a clear outcome and every call its own ledger row, never a runner crash."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import mcp_types as types
import pytest
from sqlalchemy import delete, update

from app import runtime
from app.config import Settings
from app.db import queries
from app.db.tables import Event, GatewayCall, Subtask, Swarm, ToolCall, TranscriptMessage
from app.db.types import utcnow
from app.gateway.client import GatewayClient
from app.main import create_app
from app.tools.config import ServerConfig
from app.tools.model import ToolInfo
from app.tools.registry import ToolRegistry
from app.tools.sessions import ServerConnection
from tests.conftest import make_settings

SCRIPT = re.compile(r"SCRIPT=(\w+)")


class FakeServer(ServerConnection):
    """A tool server that is up at once and answers each tool with its fixed result (a
    `CallToolResult`, or an awaitable making one); counts its calls."""

    def __init__(self, name: str, results: dict[str, Callable[[], Any]]) -> None:
        super().__init__(name, ServerConfig(command="unused", timeout_s=5))
        self.results = results
        self.calls: Counter[str] = Counter()

    def start(self) -> None:
        self.state = "up"
        self.tools = {t: ToolInfo(self.name, t, t, {"type": "object", "properties": {}})
                      for t in self.results}
        self._tried.set()

    async def session(self, wait_s: float) -> Any:
        return self

    async def send_request(self, request: types.CallToolRequest,
                           result_type: Any) -> types.CallToolResult:
        """The registry's `tools/call` (app/tools/transports.call_tool)."""
        return await self.call_tool(request.params.name, request.params.arguments or {})

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        self.calls[name] += 1
        result = self.results[name]()
        return await result if asyncio.iscoroutine(result) else result  # type: ignore[no-any-return]


def text_result(text: str, is_error: bool = False) -> Callable[[], types.CallToolResult]:
    return lambda: types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                        is_error=is_error)


def call(cid: str, name: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


@dataclass
class Scripted:
    """A gateway answering by the `SCRIPT=<name>` in a request: its n-th assistant message is
    the script's n-th list of tool calls (content null, as models send them), then a final
    text; every request body is kept."""

    scripts: dict[str, list[list[dict[str, Any]]]]

    def __post_init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        found = SCRIPT.search(json.dumps(body["messages"]))
        script = self.scripts.get(found.group(1), []) if found else []
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        message: dict[str, Any] = {"role": "assistant", "content": f"final after {turn} turns"}
        if turn < len(script):
            message = {"role": "assistant", "content": None, "tool_calls": script[turn]}
        return httpx.Response(200, json={
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10}})


class App:
    def __init__(self, settings: Settings, gateway: Scripted,
                 servers: list[FakeServer], monkeypatch: pytest.MonkeyPatch) -> None:
        self.settings, self.gateway, self.servers = settings, gateway, servers
        self._patch = monkeypatch

    async def __aenter__(self) -> httpx.AsyncClient:
        servers = self.servers

        async def start_tools(settings: Settings) -> ToolRegistry:
            registry = ToolRegistry({s.name: s.config for s in servers})
            registry.connections = {s.name: s for s in servers}
            await registry.start()
            return registry

        self._patch.setattr(runtime, "start_tools", start_tools)
        self._client = GatewayClient("http://gw/v1",
                                     transport=httpx.MockTransport(self.gateway.handle))
        self.app = create_app(self.settings, gateway=self._client)
        self._ctx = self.app.router.lifespan_context(self.app)
        await self._ctx.__aenter__()
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                      base_url="http://api")
        return self.http

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()
        await self._ctx.__aexit__(None, None, None)
        await self._client.aclose()
        await self.app.state.db_engine.dispose()


async def run(c: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await c.post("/swarms", json=body)
    assert r.status_code == 202, r.text
    return await wait(c, r.json()["id"])


async def wait(c: httpx.AsyncClient, swarm_id: str) -> dict[str, Any]:
    for _ in range(6):
        data: dict[str, Any] = (await c.get(f"/swarms/{swarm_id}", params={"wait": 10})).json()
        if data["status"] in ("succeeded", "failed", "cancelled"):
            return data
    raise AssertionError(f"swarm {swarm_id} not terminal")


async def transcript(c: httpx.AsyncClient, swarm_id: str, name: str) -> list[dict[str, Any]]:
    r = await c.get(f"/swarms/{swarm_id}/subtasks/{name}")
    assert r.status_code == 200, r.text
    return list(r.json()["transcript"])


async def tool_ledger(a: App, swarm_id: str) -> list[Any]:
    async with a.app.state.sessions() as s, s.begin():
        return list(await queries.get_tool_calls(s, swarm_id))


@pytest.fixture
def settings(database_url: str) -> Settings:
    return make_settings(database_url)


async def test_tools_that_expand_to_nothing_get_a_clear_outcome_not_a_crash_loop(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent whose server lists no tools is sent no `tools`; a model that calls tools anyway
    (content null) is answered `error: unknown tool`, and one that keeps at it fails its own
    subtask (max_turns) while its siblings' successes stand."""
    gateway = Scripted({"once": [[call("c1", "empty__gone")]],
                        "always": [[call(f"c{i}", "empty__gone")] for i in range(5)]})
    async with App(settings, gateway, [FakeServer("empty", {})], monkeypatch) as c:
        done = await run(c, {"task": "t", "synthesis": {"strategy": "none"},
                             "limits": {"failure_tolerance": 0.5}, "agents": [
            {"name": "once", "tools": ["empty"], "prompt": "SCRIPT=once"},
            {"name": "always", "tools": ["empty"], "max_turns": 2, "prompt": "SCRIPT=always"},
            {"name": "plain", "prompt": "no tools"}]})
        subs = {s["name"]: s for s in done["subtasks"]}
        assert done["status"] == "succeeded", done["error"]
        assert (subs["once"]["status"], subs["once"]["turns"]) == ("succeeded", 2)
        assert subs["once"]["output"] == "final after 1 turns"
        tool = [m for m in await transcript(c, done["id"], "once") if m["role"] == "tool"]
        assert [m["content"] for m in tool] == ["error: unknown tool 'empty__gone'"]
        assert (subs["always"]["status"], subs["always"]["error"]["code"]) == (
            "failed", "max_turns_exceeded")
        assert subs["plain"]["status"] == "succeeded"
        assert not any("tools" in b for b in gateway.bodies)  # nothing was offered


async def test_tool_text_no_database_stores_is_cleaned_and_every_call_is_in_the_ledger(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    server = FakeServer("hostile", {"nul": text_result("a\x00b"),
                                    "surrogate": text_result("x\ud800y"),
                                    "fails": text_result("boom\x00\udfff", is_error=True)})
    gateway = Scripted({"poison": [[call("n", "hostile__nul"), call("s", "hostile__surrogate"),
                                    call("f", "hostile__fails")]]})
    a = App(settings, gateway, [server], monkeypatch)
    async with a as c:
        done = await run(c, {"task": "t", "synthesis": {"strategy": "none"}, "agents": [
            {"name": "p", "tools": ["hostile"], "prompt": "SCRIPT=poison"}]})
        assert done["status"] == "succeeded", done["error"]
        assert done["subtasks"][0]["tool_calls"] == 3
        results = {m["tool_call_id"]: m["content"]
                   for m in await transcript(c, done["id"], "p") if m["role"] == "tool"}
        assert results == {"n": "a\ufffdb", "s": "x\ufffdy", "f": "error: boom\ufffd\ufffd"}
        rows = await tool_ledger(a, done["id"])
        assert sorted((r.call_id, r.status) for r in rows) == [
            ("f", "error"), ("n", "ok"), ("s", "ok")]
        assert all(r.result_bytes > 0 for r in rows)


async def test_repeated_and_overlong_call_ids_each_get_a_ledger_row(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three calls all `dup`, two ids equal in their first 128 characters: five rows; the
    transcript keeps the ids as the model sent them."""
    long_a, long_b = "L" * 128 + "a", "L" * 128 + "b"
    server = FakeServer("t", {"x": text_result("ok")})
    ids = ["dup", "dup", "dup", long_a, long_b]
    gateway = Scripted({"dup": [[call(i, "t__x") for i in ids]]})
    a = App(settings, gateway, [server], monkeypatch)
    async with a as c:
        done = await run(c, {"task": "t", "synthesis": {"strategy": "none"}, "agents": [
            {"name": "d", "tools": ["t"], "prompt": "SCRIPT=dup"}]})
        assert done["status"] == "succeeded", done["error"]
        assert done["subtasks"][0]["tool_calls"] == 5
        rows = await tool_ledger(a, done["id"])
        assert len(rows) == 5 and len({r.call_id for r in rows}) == 5
        assert all(len(r.call_id) <= 128 for r in rows)
        said = [m["tool_call_id"] for m in await transcript(c, done["id"], "d")
                if m["role"] == "tool"]
        assert said == ids
    assert server.calls["x"] == 5


async def test_a_takeover_runs_only_the_uncommitted_call_among_repeated_ids(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewound to "died with two of a turn's three `dup` calls committed": the next owner runs
    the third alone, and its result gets a row of its own."""
    server = FakeServer("t", {"a": text_result("A"), "b": text_result("B"),
                              "c": text_result("C")})
    gateway = Scripted({"dup": [[call("dup", "t__a"), call("dup", "t__b"),
                                 call("dup", "t__c")]]})
    body = {"task": "t", "synthesis": {"strategy": "none"}, "agents": [
        {"name": "d", "tools": ["t"], "prompt": "SCRIPT=dup"}]}
    a = App(settings, gateway, [server], monkeypatch)
    async with a as c:
        first = await run(c, body)
        assert first["status"] == "succeeded", first["error"]
        swarm_id = first["id"]
        messages = await transcript(c, swarm_id, "d")
    # the turn-1 assistant message, then results a, b, c; then the final answer (turn 2)
    assert [m["role"] for m in messages][-5:] == ["assistant", "tool", "tool", "tool",
                                                  "assistant"]
    last_result = len(messages) - 2
    async with a.app.state.sessions() as s, s.begin():
        await s.execute(delete(TranscriptMessage).where(
            TranscriptMessage.swarm_id == swarm_id, TranscriptMessage.seq >= last_result))
        rows = await queries.get_tool_calls(s, swarm_id)
        third = next(r for r in rows if r.tool == "c")
        await s.execute(delete(ToolCall).where(ToolCall.swarm_id == swarm_id,
                                               ToolCall.call_id == third.call_id))
        await s.execute(delete(GatewayCall).where(
            GatewayCall.swarm_id == swarm_id, GatewayCall.idempotency_key.endswith(":2")))
        await s.execute(update(Subtask).where(Subtask.swarm_id == swarm_id,
                                              Subtask.name == "d").values(
            status="running", output=None, finished_at=None, turns=1, tool_calls=2))
        await s.execute(delete(Event).where(Event.swarm_id == swarm_id,
                                            Event.type == "swarm.completed"))
        await s.execute(update(Swarm).where(Swarm.id == swarm_id).values(
            status="running", finished_at=None, result=None, lease_owner="dead:1",
            event_seq=Swarm.event_seq - 1, lease_expires_at=utcnow() - timedelta(seconds=1)))
    await a.app.state.db_engine.dispose()
    b = App(settings, gateway, [server], monkeypatch)
    async with b as c:
        done = await wait(c, swarm_id)
        assert done["status"] == "succeeded", done["error"]
        results = [m["content"] for m in await transcript(c, swarm_id, "d")
                   if m["role"] == "tool"]
        assert results == ["A", "B", "C"]
        rows = await tool_ledger(b, swarm_id)
        assert sorted(r.tool for r in rows) == ["a", "b", "c"]
    assert (server.calls["a"], server.calls["b"], server.calls["c"]) == (1, 1, 2)
