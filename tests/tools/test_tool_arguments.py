"""Nothing a model writes into tool arguments stops a server other tenants share (SPEC §9): a
lone surrogate (the JSON escape `\\ud800`), NUL, arguments nested past what the transport can
serialise, or longer than SWARM_TOOL_ARGS_MAX_BYTES. Against the example MCP server as a real
stdio process, on SQLite and PostgreSQL: the other tenant's calls in flight succeed, the server
is never restarted, new swarms are accepted, and the other tenant's swarm takes about as long
as it does alone."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.db import queries
from app.gateway.client import GatewayClient
from app.main import create_app
from app.simulator.app import create_simulator
from app.simulator.config import SimulatorConfig
from app.tools.arguments import MAX_DEPTH, ArgumentsRefused, parse_arguments
from tests.conftest import make_settings
from tests.mcp_servers import calls, stdio_server, write_config

MAX_BYTES = 4096
ATTACK = re.compile(r"ATTACK=(\w+)")
PAYLOADS = {  # the arguments text a hostile (or broken) model sends, by kind
    "surrogate": '{"query": "a\\ud800b"}',
    "surrogate_key": '{"query": "q", "\\udfff": 1}',
    "nul": '{"query": "a\\u0000b"}',
    "deep": '{"query": "d", "x": ' + "[" * 300 + "]" * 300 + "}",
    "huge": '{"query": "' + "x" * MAX_BYTES + '"}',
}


# ---- the arguments alone ---------------------------------------------------------------------


def test_lone_surrogates_and_nul_are_replaced_keys_included() -> None:
    assert parse_arguments(PAYLOADS["surrogate"], MAX_BYTES) == {"query": "a\ufffdb"}
    assert parse_arguments(PAYLOADS["nul"], MAX_BYTES) == {"query": "a\ufffdb"}
    assert parse_arguments(PAYLOADS["surrogate_key"], MAX_BYTES) == {"query": "q", "\ufffd": 1}
    nested = parse_arguments('{"a": [{"b": "\\udc00"}]}', MAX_BYTES)
    assert nested == {"a": [{"b": "\ufffd"}]}


@pytest.mark.parametrize(("text", "reason"), [
    (PAYLOADS["huge"], "bytes; at most 4096"),
    (PAYLOADS["deep"], f"deeper than {MAX_DEPTH}"),
    ("[1, 2]", "not a JSON object"),
    ("{not json", "not a JSON object"),
    ("[" * 4000, "not a JSON object"),
])
def test_arguments_that_cannot_be_sent_are_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(ArgumentsRefused, match=re.escape(reason)):
        parse_arguments(text, MAX_BYTES)


# ---- two tenants sharing one stdio server ------------------------------------------------------


class Attacking(httpx.AsyncBaseTransport):
    """The simulator, except that a tool call whose arguments name `ATTACK=<kind>` carries that
    kind's payload instead."""

    def __init__(self, simulator: Any) -> None:
        self._inner = httpx.ASGITransport(app=simulator)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        body = await response.aread()
        data = json.loads(body)
        for choice in data.get("choices", []):
            for call in choice.get("message", {}).get("tool_calls") or []:
                found = ATTACK.search(call["function"]["arguments"])
                if found:
                    call["function"]["arguments"] = PAYLOADS[found.group(1)]
        return httpx.Response(response.status_code, json=data)


@dataclass
class Shared:
    app: FastAPI
    victim: httpx.AsyncClient
    attacker: httpx.AsyncClient
    log: Path


@pytest.fixture
async def shared(database_url: str, tmp_path: Path) -> AsyncIterator[Shared]:
    log = tmp_path / "docs.log"
    config = write_config(tmp_path / "mcp.json", {
        "docs": stdio_server(log, delay_ms=300, max_concurrency=16, timeout_s=30)})
    settings = make_settings(database_url, mcp_config=config, tool_args_max_bytes=MAX_BYTES,
                             api_keys="victim:key-v,attacker:key-a")
    gateway = GatewayClient("http://sim/v1",
                            transport=Attacking(create_simulator(SimulatorConfig(latency_ms=0))))
    app = create_app(settings, gateway=gateway)
    async with app.router.lifespan_context(app):
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api",
                                     headers={"Authorization": f"Bearer {key}"})
                   for key in ("key-v", "key-a")]
        try:
            yield Shared(app, clients[0], clients[1], log)
        finally:
            for c in clients:
                await c.aclose()
            await gateway.aclose()
    await app.state.db_engine.dispose()


async def _post(c: httpx.AsyncClient, body: dict[str, Any]) -> str:
    r = await c.post("/swarms", json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


async def _wait(c: httpx.AsyncClient, swarm_id: str) -> dict[str, Any]:
    for _ in range(12):
        data: dict[str, Any] = (await c.get(f"/swarms/{swarm_id}", params={"wait": 10})).json()
        if data["status"] in ("succeeded", "failed", "cancelled"):
            return data
    raise AssertionError(f"swarm {swarm_id} not terminal")


def _victim_swarm(tag: str) -> dict[str, Any]:
    return {"task": "t", "synthesis": {"strategy": "none"}, "limits": {"concurrency": 6},
            "agents": [{"name": f"v{i}", "tools": ["docs.lookup"],
                        "prompt": f"{tag}{i} [[sim latency_ms=0 turns=3]]"} for i in range(6)]}


async def _ledger(app: FastAPI, swarm_id: str) -> list[Any]:
    async with app.state.sessions() as s, s.begin():
        return list(await queries.get_tool_calls(s, swarm_id))


async def test_hostile_arguments_fail_their_own_call_and_nobody_elses(shared: Shared) -> None:
    docs = shared.app.state.tools.connections["docs"]
    started = time.monotonic()
    alone = await _wait(shared.victim, await _post(shared.victim, _victim_swarm("alone")))
    alone_s = time.monotonic() - started
    assert alone["status"] == "succeeded", alone["error"]

    # the victim's calls are in flight (300 ms each, three turns) when the attacks arrive
    started = time.monotonic()
    victim_id = await _post(shared.victim, _victim_swarm("during"))
    await asyncio.sleep(0.2)
    attack_ids = [await _post(shared.attacker, {
        "task": "t", "synthesis": {"strategy": "none"},
        "agents": [{"name": kind, "tools": ["docs.lookup"],
                    "prompt": f"ATTACK={kind} [[sim latency_ms=0]]"} for kind in PAYLOADS]})
        for _ in range(3)]
    # a swarm created while the attacks run is accepted (the server never went away)
    later_id = await _post(shared.victim, _victim_swarm("later"))
    victim = await _wait(shared.victim, victim_id)
    during_s = time.monotonic() - started
    later = await _wait(shared.victim, later_id)

    for done in (victim, later):
        assert done["status"] == "succeeded", done["error"]
        rows = await _ledger(shared.app, done["id"])
        assert len(rows) == 18 and {r.status for r in rows} == {"ok"}, [
            (r.status, r.subtask_name) for r in rows]
    assert docs.restarts == 0 and docs.state == "up"
    assert len({e["pid"] for e in calls(shared.log)}) == 1
    # "about as long": the attackers' calls that reach the server and the later swarm's share
    # its 16 slots with the victim's (a queued 300 ms wave a turn or so, on a loaded host more);
    # a call the server stalled on would hold the victim for its 30 s timeout
    assert during_s <= 2 * alone_s + 2.0, (alone_s, during_s)

    # each hostile call is its own error, or ran with its text cleaned; its swarm went on
    for attack_id in attack_ids:
        attack = await _wait(shared.attacker, attack_id)
        assert attack["status"] == "succeeded", attack["error"]
        status = {(r.subtask_name, r.status) for r in await _ledger(shared.app, attack_id)}
        assert status == {("surrogate", "ok"), ("surrogate_key", "ok"), ("nul", "ok"),
                          ("deep", "error"), ("huge", "error")}
        for kind, reason in (("deep", "deeper than"), ("huge", "at most 4096")):
            r = await shared.attacker.get(f"/swarms/{attack_id}/subtasks/{kind}")
            tool = [m["content"] for m in r.json()["transcript"] if m["role"] == "tool"]
            assert len(tool) == 1 and tool[0].startswith("error: ") and reason in tool[0]
    seen = {e["args"]["query"] for e in calls(shared.log)}
    assert "a\ufffdb" in seen  # what the server received: cleaned, not refused
    # the attacker cannot read the victim's swarm, nor the victim the attacker's
    r = await shared.attacker.get(f"/swarms/{victim_id}")
    assert r.status_code == 404
