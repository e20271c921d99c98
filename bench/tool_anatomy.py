"""Where the tool row's time goes (docs/decisions/0038-tool-agents-in-the-first-wave.md): one
swarm of the row at a time, per build and transport, as a timeline in ms from the client's
`POST` — the workers' starts, their first turns reaching the stub gateway (its `/_stats`
arrivals), each tool call's latency in `serve` (`tool_calls.latency_ms`), the tool results
stored, the last second turn reaching the gateway, the swarm's stored end and the client
seeing it. Prints; writes nothing.

    .venv/bin/python -m bench.tool_anatomy [--runs 3] [--transports stdio,http]
        [--cli before=… --cli after=…]
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.bench_tool_row import TRANSPORTS, example_server, row_parser, serving
from bench.bench_tools import TERMINAL, tool_swarm
from bench.builds import add_builds
from bench.builds import builds as bench_builds
from tests.mcp_servers import HttpServer
from tests.support import CLI, free_port, process


def spread(xs: list[float]) -> str:
    """min / p50 / max of a list of ms."""
    return f"{min(xs):.0f}/{statistics.median(xs):.0f}/{max(xs):.0f}"


def one_swarm(api: str, agents: int, tools: tuple[str, ...]) -> tuple[str, float, float]:
    """(the swarm's id, the client's clock at its POST (Unix s), the wall until it saw the end)."""
    body = tool_swarm(agents, 1, tools)
    with httpx.Client(timeout=60) as c:
        t0, p0 = time.time(), time.perf_counter()
        swarm_id = c.post(f"{api}/swarms", json=body).raise_for_status().json()["id"]
        while c.get(f"{api}/swarms/{swarm_id}", params={"wait": 30}
                    ).raise_for_status().json()["status"] not in TERMINAL:
            pass
        return swarm_id, t0, time.perf_counter() - p0


async def timeline(db: str, sim: str, swarm_id: str, t0: float, seen: float) -> str:
    conn = await asyncpg.connect(db.replace("+asyncpg", ""))
    try:
        swarm = await conn.fetchrow("SELECT finished_at FROM swarms WHERE id = $1", swarm_id)
        subs = await conn.fetch("SELECT started_at FROM subtasks WHERE swarm_id = $1",
                                swarm_id)
        tools = await conn.fetch("SELECT created_at, latency_ms FROM tool_calls "
                                 "WHERE swarm_id = $1", swarm_id)
    finally:
        await conn.close()
    arrivals: dict[str, Any] = httpx.get(f"{sim}/_stats").json()["by_key"]

    def ms(at: Any) -> float:
        return (float(at.timestamp()) - t0) * 1000

    def reached(turn: int) -> list[float]:
        return [(v["received_at"] - t0) * 1000 for k, v in arrivals.items()
                if k.startswith(f"{swarm_id}:") and k.endswith(f":{turn}")]

    latency = [t["latency_ms"] for t in tools]
    return (f"started {spread([ms(s['started_at']) for s in subs])} | first turn at the "
            f"gateway {spread(reached(1))} | tool latency {spread(latency)}"
            f" | results stored {spread([ms(t['created_at']) for t in tools])} | second turn at "
            f"the gateway {spread(reached(2))} | ended {ms(swarm['finished_at']):.0f} | seen "
            f"{seen * 1000:.0f}")


def main() -> None:
    ap = row_parser(runs=3)
    ap.add_argument("--sessions", type=int, default=8, help="SWARM_MCP_HTTP_SESSIONS")
    ap.add_argument("--transports", default="stdio,http")
    add_builds(ap, "a build to look at (repeatable; default this checkout's)")
    args = ap.parse_args()
    clis = bench_builds(args) or {"this": CLI}
    work = Path(tempfile.mkdtemp(prefix="bench-tool-anatomy-"))
    port = free_port()
    sim = f"http://127.0.0.1:{port}/v1"
    print("ms from the POST (min/p50/max where many)")
    with ExitStack() as stack:
        stack.enter_context(process(["simulator", "--port", str(port)],
                                    {"SWARM_SIM_LATENCY_MS": str(args.latency_ms)},
                                    f"{sim}/models", work / "sim.log"))
        serves = {}
        for name, cli in clis.items():
            web = HttpServer(work / f"web-{name}.log", args.tool_ms, example_server(cli))
            stack.callback(web.close)
            serves[name] = stack.enter_context(serving(
                work, sim, args.sessions, args.agents, args.tool_ms, web, cli, label=name))
        for _ in range(args.runs):  # builds interleaved: a drift of the machine hits each
            for name, (api, _, db) in serves.items():
                for transport in args.transports.split(","):
                    swarm_id, t0, seen = one_swarm(api, args.agents, TRANSPORTS[transport])
                    line = asyncio.run(timeline(db, sim, swarm_id, t0, seen))
                    print(f"{name} {transport}: {line}", flush=True)


if __name__ == "__main__":
    main()
