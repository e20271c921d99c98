"""Many calls in flight to one MCP server (the example server as real processes): a
streamable-HTTP server's calls spread over a pool of sessions, a session that dies is replaced
while the others go on, the per-server limit holds across the pool, and a stdio server serves
overlapping requests on its one session. The server's own log says which session served what."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.mcp_servers import calls, http_server, max_in_flight, registry, stdio_server


def sessions_of(log: Path, tool: str) -> dict[str, str]:
    """Each started call of `tool` (by its arguments) -> the session that served it."""
    return {str(sorted(e["args"].values())): e["session"] for e in calls(log) if e["tool"] == tool}


async def test_calls_spread_over_the_pool_and_stop_closes_it(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with http_server(log) as server, registry(
            {"url": server.url, "max_concurrency": 12}, http_sessions=3) as tools:
        pool = tools.connections["s"].pool
        assert pool is not None and pool.open_sessions == 0  # opened as calls need them
        outcomes = await asyncio.gather(*(tools.call("s", "sleep", {"seconds": 0.5 + i / 1000})
                                          for i in range(12)))
        assert [o.status for o in outcomes] == ["ok"] * 12
        served = set(sessions_of(log, "sleep").values())
        assert len(served) == 3  # every pooled session took calls, none beyond the size
        assert max_in_flight(log, "sleep") > 3
        assert pool.open_sessions == 3
    assert pool.open_sessions == 0


async def test_one_session_without_a_pool(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with http_server(log) as server, registry(
            {"url": server.url, "max_concurrency": 8}, http_sessions=1) as tools:
        outcomes = await asyncio.gather(*(tools.call("s", "sleep", {"seconds": 0.3 + i / 1000})
                                          for i in range(8)))
        assert [o.status for o in outcomes] == ["ok"] * 8
        assert len(set(sessions_of(log, "sleep").values())) == 1
        assert tools.connections["s"].pool is None


async def test_the_server_limit_holds_across_the_pool(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with http_server(log) as server, registry(
            {"url": server.url, "max_concurrency": 2}, http_sessions=4) as tools:
        outcomes = await asyncio.gather(*(tools.call("s", "sleep", {"seconds": 0.2 + i / 1000})
                                          for i in range(8)))
        assert [o.status for o in outcomes] == ["ok"] * 8
        assert max_in_flight(log, "sleep") == 2


async def test_a_dead_session_is_replaced_and_the_others_go_on(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with http_server(log) as server, registry(
            {"url": server.url, "max_concurrency": 9}, http_sessions=3) as tools:
        pending = [asyncio.create_task(tools.call("s", "sleep", {"seconds": 2 + i / 1000}))
                   for i in range(9)]
        while len(calls(log)) < 9:  # every call started on the server
            await asyncio.sleep(0.05)
        served = sessions_of(log, "sleep")
        killed = next(iter(served.values()))
        async with httpx.AsyncClient() as http:  # the server ends that session (as on restart)
            gone = await http.delete(server.url, headers={"mcp-session-id": killed})
        assert gone.status_code == 200
        outcomes = await asyncio.gather(*pending)
        for i, outcome in enumerate(outcomes):
            if served[str([2 + i / 1000])] != killed:
                assert outcome.status == "ok", outcome.text
        assert any(o.status == "error" for o in outcomes)  # the killed session's calls
        pool = tools.connections["s"].pool
        assert pool is not None
        async with asyncio.timeout(30):  # its failed calls had it pinged: it is dropped
            while pool.open_sessions > 2:
                await asyncio.sleep(0.05)
        # the next busy moments open a session in its place; the dead one serves nothing
        for round_ in range(3):
            again = await asyncio.gather(*(
                tools.call("s", "sleep", {"seconds": round_ + 0.3 + i / 1000}) for i in range(9)))
            assert [o.status for o in again] == ["ok"] * 9
        after = {s for k, s in sessions_of(log, "sleep").items() if k not in served}
        assert killed not in after
        assert after - set(served.values())  # a new session served some of them


async def test_stdio_requests_overlap_on_one_session(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with registry(stdio_server(log, max_concurrency=10), http_sessions=4) as tools:
        assert tools.connections["s"].pool is None  # stdio: one process, one session
        outcomes = await asyncio.gather(*(tools.call("s", "sleep", {"seconds": 1 + i / 1000})
                                          for i in range(10)))
        assert [o.status for o in outcomes] == ["ok"] * 10
        assert len({e["pid"] for e in calls(log)}) == 1
        assert max_in_flight(log, "sleep") > 1  # requests pipelined, matched by JSON-RPC id
