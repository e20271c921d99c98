"""Durable turns with real processes on PostgreSQL: a worker running 20 tool-using agents is
SIGKILLed between two turns; another worker finishes them, and the tool servers' own call logs
show that no tool call whose result was committed ran again."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import UNCAPPED, until
from tests.mcp_servers import HttpServer, counts, free_port, stdio_server, write_config
from tests.procs import (
    Cluster,
    Db,
    Proc,
    cluster,
    post_swarm,
    sim_stats,
    wait_http,
    wait_terminal,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(300)]


@pytest.fixture
def http_mcp(tmp_path: Path) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path / "web.log", delay_ms=50)
    yield server
    server.close()


async def _committed_calls(db: Db, swarm_id: str) -> dict[tuple[str, str], str]:
    """(subtask, call id) -> the server's log key (tool + arguments) of every tool call with a
    committed result, from the tool ledger and the transcript's assistant messages."""
    asked: dict[tuple[str, str], str] = {}
    for row in await db.fetch("SELECT subtask_name, message FROM transcript_messages "
                              "WHERE swarm_id = $1", swarm_id):
        for call in row["message"].get("tool_calls") or []:
            server, _, tool = call["function"]["name"].partition("__")
            args = json.dumps(json.loads(call["function"]["arguments"]), sort_keys=True)
            asked[(row["subtask_name"], call["id"])] = f"{server}|{tool}:{args}"
    ledger = await db.fetch("SELECT subtask_name, call_id FROM tool_calls WHERE swarm_id = $1",
                            swarm_id)
    return {(r["subtask_name"], r["call_id"]): asked[(r["subtask_name"], r["call_id"])]
            for r in ledger}


# every process imports the MCP SDK and starts its stdio server: slow on a loaded machine
START_S = 180


async def _api(c: Cluster) -> str:
    port = free_port()
    return await _ready(c.spawn("api", ["serve", "--no-engine", "--port", str(port)]), port)


async def _ready(proc: Proc, port: int) -> str:
    """`serve`'s URL once it is ready and its tool servers are up."""
    url = f"http://127.0.0.1:{port}"
    await wait_http(proc, f"{url}/readyz", timeout=START_S, ok_only=True)

    async def tools_up() -> bool:
        async with httpx.AsyncClient(timeout=5) as client:
            states = (await client.get(f"{url}/readyz")).json()["tool_servers"]
        return set(states.values()) == {"up"}

    await until(tools_up, START_S, "the API's tool servers")
    return url


async def _worker(c: Cluster, name: str, **env: str) -> Proc:
    proc = c.spawn(name, ["worker"], **env)
    await proc.wait_log(" running", timeout=START_S)
    return proc


def _server_counts(tmp_path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for server, log in (("docs", tmp_path / "docs.log"), ("web", tmp_path / "web.log")):
        out.update({f"{server}|{k}": n for k, n in counts(log).items()})
    return out


async def test_kill_between_turns_never_reruns_a_committed_tool_call(
        db_url: str, tmp_path: Path, http_mcp: HttpServer) -> None:
    db = Db(db_url)
    config = write_config(tmp_path / "mcp.json", {
        "docs": stdio_server(tmp_path / "docs.log", delay_ms=50, max_concurrency=8),
        "web": {"url": http_mcp.url, "max_concurrency": 8}})
    body: dict[str, Any] = {"task": "durable turns", "synthesis": {"strategy": "none"},
                            "limits": {"concurrency": 20}, "agents": [
        {"name": f"a{i:02d}", "tools": ["docs.lookup", "web.lookup"],
         "prompt": f"crash-{i:02d} [[sim latency_ms=200 turns=2]]"} for i in range(20)]}
    async with cluster(db_url, tmp_path, SWARM_MCP_CONFIG=config) as c:
        await c.simulator(latency_ms=20)
        api, a = await asyncio.gather(
            _api(c), _worker(c, "worker_a", SWARM_CRASH_AT="between_turns:a07"))
        swarm_id = (await post_swarm(api, body))["id"]
        assert await a.wait_exit(120) == -signal.SIGKILL, a.log()[-3000:]

        before = await _committed_calls(db, swarm_id)
        assert len(before) >= 2  # a07's first turn at least
        b = await _worker(c, "worker_b")
        done = await wait_terminal(api, swarm_id, timeout=120)
        assert done["status"] == "succeeded", done["error"]
        assert b.alive
        for sub in done["subtasks"]:
            assert (sub["turns"], sub["tool_calls"]) == (3, 4), sub
            assert sub["output"].startswith("Based on the tool results")

        after = await _committed_calls(db, swarm_id)
        assert len(after) == 80 and set(before) <= set(after)  # one ledger row per call
        ran = _server_counts(tmp_path)
        assert all(ran.get(key, 0) >= 1 for key in after.values())
        # the point: a call whose result was committed before the kill never ran again
        assert [key for key in before.values() if ran[key] != 1] == []
        # only calls in flight at the kill ran twice
        again = [key for key in after.values() if ran[key] > 1]
        assert len(again) <= 40 and not set(again) & set(before.values())


async def test_a_creator_killed_before_its_first_turn(db_url: str, tmp_path: Path) -> None:
    """A `serve` with its engine claims a tool-using swarm as it creates it, the creation's
    statement writing the first turn's call ahead; killed before that call is sent, it leaves
    the row in flight. A worker takes over: the row is billed `unknown` at its reservation,
    the turn goes again as attempt 2, its tool runs once, the answering turn once (the
    subtask's third attempt: attempts count by subtask)."""
    db = Db(db_url)
    config = write_config(tmp_path / "mcp.json", {"docs": stdio_server(tmp_path / "docs.log")})
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(UNCAPPED)  # no admission lock: the creation writes the first wave
    body = {"task": "killed before its first turn", "synthesis": {"strategy": "none"},
            "agents": [{"name": "a", "tools": ["docs.lookup"], "prompt": "look [[sim turns=1]]"}]}
    async with cluster(db_url, tmp_path, SWARM_MCP_CONFIG=config,
                       SWARM_TENANTS_FILE=str(tenants)) as c:
        sim = await c.simulator(latency_ms=20)
        port = free_port()
        creator = c.spawn("creator", ["serve", "--port", str(port)],
                          SWARM_CRASH_AT="before_call:a")
        swarm_id = (await post_swarm(await _ready(creator, port), body))["id"]
        assert await creator.wait_exit(60) == -signal.SIGKILL, creator.log()[-3000:]
        (ahead,) = await db.ledger(swarm_id)
        assert (ahead["attempt"], ahead["outcome"]) == (1, "in_flight")

        api = await _api(c)
        await _worker(c, "worker_b")
        done = await wait_terminal(api, swarm_id, timeout=120)
        assert done["status"] == "succeeded", done["error"]
        assert (done["subtasks"][0]["turns"], done["subtasks"][0]["tool_calls"]) == (2, 1)
        rows = await db.ledger(swarm_id)
        assert [(r["idempotency_key"].rsplit(":", 1)[1], r["attempt"], r["outcome"])
                for r in rows] == [("1", 1, "unknown"), ("1", 2, "ok"), ("2", 3, "ok")]
        assert rows[0]["cost_usd"] == rows[0]["reserved_usd"] > 0
        assert Decimal(done["usage"]["cost_usd"]) == sum(r["cost_usd"] for r in rows)
        stats = (await sim_stats(sim))["by_key"]
        assert [stats[f"{swarm_id}:a:{n}"]["ok"] for n in (1, 2)] == [1, 1]
        assert list(_server_counts(tmp_path).values()) == [1]  # the tool ran once
