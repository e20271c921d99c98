"""Tool servers from SWARM_MCP_CONFIG (real stdio and HTTP processes): GET /tools, /readyz,
validation of tool selectors at creation, one subtask's view; the priority slots."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.tools.limits import PrioritySemaphore
from tests.conftest import Harness, make_settings, start_harness
from tests.mcp_servers import HttpServer, write_config


@pytest.fixture(scope="module")
def http_mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path_factory.mktemp("mcp") / "http.log")
    yield server
    server.close()


@pytest.fixture
async def tooled(sqlite_url: str, tmp_path: Path, http_mcp: HttpServer) -> AsyncIterator[Harness]:
    # stdio servers take seconds to import the SDK on a loaded machine: the engine tests start
    # them; here one HTTP process serves under two names
    config = write_config(tmp_path / "mcp.json", {
        "docs": {"url": http_mcp.url, "max_concurrency": 4},
        "web": {"url": http_mcp.url, "headers": {"X-Test": "1"}, "max_concurrency": 4},
        "broken": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]},
    })
    h, close = await start_harness(make_settings(sqlite_url, mcp_config=config))
    yield h
    await close()


def _agent(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "prompt": f"{name} [[sim latency_ms=0]]", **kw}


async def test_tools_lists_every_tool_of_the_servers_that_are_up(tooled: Harness) -> None:
    r = await tooled.client.get("/tools")
    assert r.status_code == 200
    items = r.json()["items"]
    names = [(t["server"], t["name"]) for t in items]
    expected = [(s, t) for s in ("docs", "web") for t in ("fail", "lookup", "read_file", "sleep")]
    assert names == expected  # the broken server offers nothing
    lookup = items[names.index(("docs", "lookup"))]
    assert lookup["input_schema"]["required"] == ["query"]
    assert "contain" in lookup["description"]


async def test_readyz_shows_each_server_state_and_stays_ready(tooled: Harness) -> None:
    r = await tooled.client.get("/readyz")
    assert r.status_code == 200
    assert r.json()["tool_servers"] == {"docs": "up", "web": "up", "broken": "down"}


REFUSED = [
    ({"agents": [_agent("a", tools=["nope"])]}, "unknown_tool", "agents.0.tools.0"),
    ({"agents": [_agent("a"), _agent("b", tools=["docs", "docs.nope"])]}, "unknown_tool",
     "agents.1.tools.1"),
    ({"agents": [_agent("a", tools=["broken"])]}, "tool_server_unavailable", "agents.0.tools.0"),
    ({"tools": ["web.lookup", "web.zzz"]}, "unknown_tool", "tools.1"),
]
MALFORMED = [
    {"agents": [_agent("a", tools=["docs lookup"])]},
    {"agents": [_agent("a", tools=[])]},
    {"agents": [_agent("a", tools=["docs"], max_turns=0)]},
    {"agents": [_agent("a", tools=["docs"], max_turns=51)]},
    {"limits": {"max_tool_calls": 0}},
]


async def test_unknown_down_or_malformed_tools_are_422_naming_the_field(tooled: Harness) -> None:
    for body, code, field in REFUSED:
        r = await tooled.post({"task": "t", **body})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert (err["code"], err["details"]["field"]) == (code, field)
    for body in MALFORMED:
        r = await tooled.post({"task": "t", **body})
        assert r.status_code == 422, (body, r.text)
    listed = (await tooled.client.get("/swarms")).json()["items"]
    assert listed == []  # nothing was stored


async def test_tools_without_any_server_configured_are_422(api: Harness) -> None:
    r = await api.post({"task": "t", "agents": [_agent("a", tools=["docs"])]})
    assert r.status_code == 422
    assert r.json()["error"]["details"]["field"] == "agents.0.tools.0"
    assert (await api.client.get("/tools")).json() == {"items": []}
    assert (await api.client.get("/readyz")).json()["tool_servers"] == {}


async def test_one_subtask_with_its_transcript(tooled: Harness) -> None:
    done = await tooled.run({"task": "t", "synthesis": {"strategy": "none"}, "agents": [
        _agent("plain"), _agent("user", tools=["docs.lookup", "web"], max_turns=3)]})
    assert done["status"] == "succeeded", done
    r = await tooled.client.get(f"/swarms/{done['id']}/subtasks/plain")
    assert r.status_code == 200
    plain = r.json()
    assert (plain["transcript"], plain["tools"], plain["turns"]) == ([], [], 0)
    user = (await tooled.client.get(f"/swarms/{done['id']}/subtasks/user")).json()
    assert (user["tools"], user["max_turns"], user["turns"]) == (["docs.lookup", "web"], 3, 2)
    assert user["tool_calls"] == 5  # docs.lookup and the four tools of web, once
    roles = [m["role"] for m in user["transcript"]]
    assert roles == ["user", "assistant", *["tool"] * 5, "assistant"]
    assert user["output"] == user["transcript"][-1]["content"]
    for missing in (f"/swarms/{done['id']}/subtasks/nobody", "/swarms/not-a-uuid/subtasks/a"):
        r = await tooled.client.get(missing)
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "not_found"


async def test_waiters_are_served_by_priority_then_in_arrival_order() -> None:
    sem = PrioritySemaphore(1)
    await sem.acquire()
    order: list[str] = []

    async def waiter(name: str, priority: int) -> None:
        await sem.acquire(priority)
        order.append(name)
        sem.release()

    tasks = []
    for name, priority in [("low1", 1), ("high1", 5), ("low2", 1), ("high2", 5), ("mid", 3)]:
        tasks.append(asyncio.create_task(waiter(name, priority)))
        await asyncio.sleep(0)
    cancelled = asyncio.create_task(waiter("gone", 9))
    await asyncio.sleep(0)
    cancelled.cancel()
    sem.release()
    await asyncio.gather(*tasks)
    assert order == ["high1", "high2", "mid", "low1", "low2"]


async def test_a_name_no_subtask_can_have_is_404_on_every_backend(harness: Harness) -> None:
    """Every subtask the swarm lists (planner, workers, compressors, synthesizer) is served;
    a name none can have (a NUL: PostgreSQL cannot compare it) is 404, not a 500."""
    done = await harness.run({"task": "t", "synthesis": {"compress": "always"}})
    assert done["status"] == "succeeded", done["error"]
    names = [s["name"] for s in done["subtasks"]]
    assert {"@planner", "@synthesizer"} <= set(names)
    assert any(n.startswith("@compress.") for n in names), names
    for name in names:
        r = await harness.client.get(f"/swarms/{done['id']}/subtasks/{name}")
        assert r.status_code == 200, (name, r.text)
    for name in ("%00", "a%00b", "@compress.%00", "@compress.@planner", "@other", "a b",
                 "x" * 65, "%C3%A9"):
        r = await harness.client.get(f"/swarms/{done['id']}/subtasks/{name}")
        assert r.status_code == 404, (name, r.text)
        assert r.json()["error"]["code"] == "not_found"


async def test_an_estimate_counts_every_turn_of_a_tool_agent(tooled: Harness) -> None:
    body = {"task": "Look it up", "synthesis": {"strategy": "none"}, "agents": [
        _agent("plain"), _agent("reader", tools=["docs"], max_turns=3)]}
    r = await tooled.client.post("/swarms/estimate", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["calls"] == {"expected": 4.0, "max": 4}  # no history: every turn
    assert got["plan"]["agents"][1]["tools"] == ["docs"]
    plain = (await tooled.client.post("/swarms/estimate", json={
        **body, "agents": [_agent("plain"), _agent("reader", max_turns=3)]})).json()
    # the tool definitions travel with every turn
    assert got["tokens"]["max"] > plain["tokens"]["max"] + 2 * 16384
    bad = await tooled.client.post("/swarms/estimate", json={
        **body, "agents": [_agent("reader", tools=["nowhere"])]})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "unknown_tool"
