"""Tool-using agents end to end on SQLite and PostgreSQL, against the example MCP server as
real processes (stdio, started by the engine; streamable HTTP, started here)."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.db import queries
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import until
from tests.mcp_servers import HttpServer, calls, counts, max_in_flight, stdio_server, write_config


@pytest.fixture(scope="module")
def http_mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    # slow enough that 30 agents pile up behind each limit
    server = HttpServer(tmp_path_factory.mktemp("mcp") / "http.log", delay_ms=150)
    yield server
    server.close()


async def _harness(database_url: str, tmp_path: Path, servers: dict[str, Any]
                   ) -> tuple[Harness, Any]:
    config = write_config(tmp_path / "mcp.json", servers)
    return await start_harness(make_settings(database_url, mcp_config=config))


@pytest.fixture
async def limited(database_url: str, tmp_path: Path, http_mcp: HttpServer
                  ) -> AsyncIterator[Harness]:
    h, close = await _harness(database_url, tmp_path, {
        "docs": stdio_server(tmp_path / "docs.log", delay_ms=200, max_concurrency=4,
                             tool_concurrency={"lookup": 3}),
        "web": {"url": http_mcp.url, "max_concurrency": 4, "tool_concurrency": {"lookup": 3}},
    })
    yield h
    await close()


async def _detail(h: Harness, swarm_id: str, name: str) -> dict[str, Any]:
    r = await h.client.get(f"/swarms/{swarm_id}/subtasks/{name}")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def _ledger(h: Harness, swarm_id: str) -> list[Any]:
    async with h.app.state.sessions() as s, s.begin():
        return await queries.get_tool_calls(s, swarm_id)


async def test_thirty_agents_share_two_servers_within_their_limits(
        limited: Harness, tmp_path: Path, http_mcp: HttpServer) -> None:
    tag = uuid.uuid4().hex[:8]
    agents = [{"name": f"a{i:02d}", "tools": ["docs.lookup", "web.lookup"],
               "prompt": f"{tag}-{i:02d} [[sim latency_ms=20]]"} for i in range(30)]
    done = await limited.run({"task": "look things up", "agents": agents,
                              "synthesis": {"strategy": "none"},
                              "limits": {"concurrency": 30}}, timeout=120)
    assert done["status"] == "succeeded", done["error"]
    for sub in done["subtasks"]:
        assert (sub["turns"], sub["tool_calls"]) == (2, 2)
        detail = await _detail(limited, done["id"], sub["name"])
        results = [m["content"] for m in detail["transcript"] if m["role"] == "tool"]
        assert len(results) == 2
        for text in results:  # every answer quotes its tool results
            assert text.startswith("lookup '") and text in sub["output"]
    # what the servers measured: never more than the limits, and the limits were reached
    docs_log = tmp_path / "docs.log"
    assert max_in_flight(docs_log, "lookup") == 3
    assert max_in_flight(docs_log) <= 4
    web = [e for e in calls(http_mcp.log) if e["args"].get("query", "").startswith(tag)]
    assert len(web) == 30 and max(e["tool_in_flight"] for e in web) == 3
    # one ledger row per tool call, and each call ran exactly once on its server
    ledger = await _ledger(limited, done["id"])
    assert len(ledger) == 60
    assert {(r.subtask_name, r.server, r.tool, r.status, r.turn) for r in ledger} == {
        (f"a{i:02d}", s, "lookup", "ok", 1) for i in range(30) for s in ("docs", "web")}
    assert all(r.result_bytes > 0 and r.latency_ms > 0 for r in ledger)
    ours = {k: n for k, n in (counts(docs_log) + counts(http_mcp.log)).items() if tag in k}
    assert len(ours) == 30 and set(ours.values()) == {2}  # same args on both servers: 1 each
    events = (await limited.client.get(f"/swarms/{done['id']}/events")).text
    assert events.count("event: subtask.turn") == 60  # two turns per agent


@pytest.fixture
async def mixed(database_url: str, tmp_path: Path, http_mcp: HttpServer
                ) -> AsyncIterator[Harness]:
    h, close = await _harness(database_url, tmp_path, {
        "docs": stdio_server(tmp_path / "docs.log", timeout_s=30),
        "web": {"url": http_mcp.url, "timeout_s": 1.0},
    })
    yield h
    await close()


async def test_misbehaving_tools_limits_planner_and_a_restarted_server(
        mixed: Harness, tmp_path: Path) -> None:
    h = mixed
    # a tool that raises, one that times out, a tool nobody offered: the subtask goes on
    done = await h.run({"task": "t", "synthesis": {"strategy": "none"}, "agents": [
        {"name": "bad", "tools": ["docs.fail", "web.sleep"],
         "prompt": "oops [[sim latency_ms=0 extra_tool=docs__nothing]]"}]}, timeout=60)
    assert done["status"] == "succeeded", done["error"]
    detail = await _detail(h, done["id"], "bad")
    seen = [m["content"] for m in detail["transcript"] if m["role"] == "tool"]
    assert len(seen) == 3 and all(t.startswith("error: ") for t in seen), seen
    assert "timed out after 1 s" in seen[1] and "unknown tool 'docs__nothing'" in seen[2]
    ledger = await _ledger(h, done["id"])
    assert sorted((r.server, r.tool, r.status) for r in ledger) == [
        ("docs", "fail", "error"), ("docs", "nothing", "error"), ("web", "sleep", "timeout")]

    # max_turns: a model that keeps calling tools fails its subtask
    done = await h.run({"task": "t", "agents": [
        {"name": "loop", "tools": ["docs.lookup"], "max_turns": 2,
         "prompt": "again [[sim latency_ms=0 turns=5]]"}]}, timeout=60)
    loop = next(s for s in done["subtasks"] if s["name"] == "loop")
    assert (loop["status"], loop["error"]["code"], loop["turns"]) == (
        "failed", "max_turns_exceeded", 2)
    assert len(await _ledger(h, done["id"])) == 1  # the second turn's calls never ran

    # max_tool_calls: the swarm fails once its tool calls would pass the limit
    done = await h.run({"task": "t", "limits": {"max_tool_calls": 4, "concurrency": 1},
                        "agents": [{"name": f"c{i}", "tools": ["docs.lookup"],
                                    "prompt": f"count {i} [[sim latency_ms=0 turns=2]]"}
                                   for i in range(3)]}, timeout=60)
    assert (done["status"], done["error"]["code"]) == ("failed", "tool_budget_exceeded")
    assert len(await _ledger(h, done["id"])) == 4

    # the planner hands the request's tools to planned subtasks
    done = await h.run({"task": "plan with tools [[sim latency_ms=0]]",
                        "tools": ["docs.lookup"]}, timeout=60)
    assert done["status"] == "succeeded", done["error"]
    workers = [s for s in done["subtasks"] if s["kind"] == "worker"]
    assert workers and all(s["tool_calls"] == 1 for s in workers)
    assert (await _detail(h, done["id"], workers[0]["name"]))["tools"] == ["docs.lookup"]

    # the stdio server killed mid-swarm is started again and the swarm completes
    log = tmp_path / "docs.log"
    before = {e["pid"] for e in calls(log)}
    # enough turns after the kill that some run once the supervisor has noticed the death
    # and started the server again (a stdio start takes a second or two): calls before that
    # get the dead session's error, which the agents go on from
    r = await h.post({"task": "t", "synthesis": {"strategy": "none"}, "agents": [
        {"name": f"k{i}", "tools": ["docs.lookup"], "max_turns": 10,
         "prompt": f"kill {i} [[sim latency_ms=300 turns=8]]"} for i in range(4)]})
    swarm_id = r.json()["id"]
    await until(lambda: _started(log, "kill"), 30, "the first tool calls")
    os.kill(before.pop(), signal.SIGKILL)
    done = await h.wait(swarm_id, timeout=90)
    assert done["status"] == "succeeded", done["error"]
    assert all(s["turns"] == 9 for s in done["subtasks"])
    pids = {e["pid"] for e in calls(log) if e["args"].get("query", "").startswith("kill")}
    assert len(pids) == 2
    assert h.app.state.tools.connections["docs"].restarts >= 1


async def _started(log: Path, prefix: str) -> bool:
    await asyncio.sleep(0)
    return any(e["args"].get("query", "").startswith(prefix) for e in calls(log))
