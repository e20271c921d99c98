"""Tool-using agents: N agents x T tool turns x 2 tools (one stdio and one streamable-HTTP MCP
server, both the example server with a fixed tool latency) against the simulator at a fixed
latency, through a real `swarm-api serve`. Compares the wall time with the critical path of one
agent, (T + 1) gateway calls + T tool latencies (its last turn answers without tools).
Prints its figures (bench/RESULTS.md's "Other workloads" row is updated from them).

    .venv/bin/python -m bench.bench_tools [--agents 100] [--turns 3] [--latency-ms 200]
                                          [--tool-ms 50] [--runs 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.mcp_servers import SERVER, HttpServer
from tests.support import CLI, free_port, process

TERMINAL = ("succeeded", "failed", "cancelled")


def tool_swarm(agents: int, turns: int, tools: tuple[str, ...]) -> dict[str, Any]:
    """A swarm of `agents` all at once, each `turns` turns calling `tools`, then an answer."""
    return {"task": "benchmark tools", "synthesis": {"strategy": "none"}, "max_tokens": 200,
            "limits": {"concurrency": agents, "max_tool_calls": 100_000},
            "agents": [{"name": f"agent_{i}", "tools": list(tools),
                        "max_turns": turns + 1, "prompt": f"bench {i} [[sim turns={turns}]]"}
                       for i in range(agents)]}


def run_swarm(api: str, agents: int, turns: int,
              tools: tuple[str, ...] = ("docs.lookup", "web.lookup"),
              on_end: Callable[[], None] | None = None) -> tuple[float, dict[str, Any]]:
    """(wall, the swarm's view) of one swarm; `on_end` runs as its end is seen, before the
    transcripts are checked (what `serve` spends on those reads is not the swarm's)."""
    body = tool_swarm(agents, turns, tools)
    with httpx.Client(timeout=60) as c:
        t0 = time.perf_counter()
        swarm_id = c.post(f"{api}/swarms", json=body).raise_for_status().json()["id"]
        while True:
            r = c.get(f"{api}/swarms/{swarm_id}", params={"wait": 30})
            if r.status_code == 503:  # SQLite busy past its timeout on a loaded machine
                time.sleep(0.5)
                continue
            data: dict[str, Any] = r.raise_for_status().json()
            if data["status"] in TERMINAL:
                break
        wall = time.perf_counter() - t0
    if on_end is not None:
        on_end()
    assert data["status"] == "succeeded", data["error"]
    assert all(s["tool_calls"] == len(tools) * turns for s in data["subtasks"])
    with httpx.Client(timeout=60) as c:  # every call answered, none an `error: …`
        for s in data["subtasks"]:
            detail = c.get(f"{api}/swarms/{swarm_id}/subtasks/{s['name']}").json()
            bad = [m["content"] for m in detail["transcript"]
                   if m["role"] == "tool" and m["content"].startswith("error:")]
            assert not bad, bad[:3]
    return wall, data


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "serve exited"
        try:
            r = httpx.get(url, timeout=2)
            if r.status_code == 200 and set(r.json()["tool_servers"].values()) == {"up"}:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready with its tool servers in {timeout}s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=200)
    ap.add_argument("--tool-ms", type=float, default=50)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tools-"))
    sim_port, api_port = free_port(), free_port()
    sim, api = f"http://127.0.0.1:{sim_port}/v1", f"http://127.0.0.1:{api_port}"
    web = HttpServer(work / "web.log", delay_ms=args.tool_ms)
    # 32 calls in flight per server: more on one streamable-HTTP session of the Python SDK
    # ended in "Connection closed" for every call in flight (measured, ~100+ at once)
    slots = {"max_concurrency": 32}
    (work / "mcp.json").write_text(json.dumps({"mcpServers": {
        "docs": {"command": sys.executable, "args": [str(SERVER)],
                 "env": {"EXAMPLE_MCP_DELAY_MS": str(args.tool_ms)}, **slots},
        "web": {"url": web.url, **slots}}}))
    env = {**os.environ, "SWARM_DATABASE_URL": f"sqlite+aiosqlite:///{work}/bench.db",
           "SWARM_GATEWAY_URL": sim, "SWARM_AUTO_MIGRATE": "1",
           "SWARM_MCP_CONFIG": str(work / "mcp.json")}
    rows: list[tuple[float, float, float]] = []
    try:
        with process(["simulator", "--port", str(sim_port)],
                     {"SWARM_SIM_LATENCY_MS": str(args.latency_ms)}, f"{sim}/models",
                     work / "sim.log"), (work / "api.log").open("wb") as out:
            serve = subprocess.Popen([CLI, "serve", "--port", str(api_port)], env=env,
                                     stdout=out, stderr=subprocess.STDOUT, cwd=work)
            try:
                wait_ready(f"{api}/readyz", serve)
                run_swarm(api, args.agents, args.turns)  # warm-up
                for _ in range(args.runs):
                    wall, d = run_swarm(api, args.agents, args.turns)
                    rows.append((wall, d["timing"]["wall_s"], d["timing"]["critical_path_s"]))
                    print(f"end-to-end {wall:.3f} s, swarm wall {rows[-1][1]:.3f} s, "
                          f"longest agent {rows[-1][2]:.3f} s")
            finally:
                serve.terminate()
                serve.wait(30)
    finally:
        web.close()
    ideal = ((args.turns + 1) * args.latency_ms + args.turns * args.tool_ms) / 1000
    e2e = statistics.median(r[0] for r in rows)
    swall = statistics.median(r[1] for r in rows)
    longest = statistics.median(r[2] for r in rows)
    calls = args.agents * args.turns * 2
    lines = [
        f"\n## Tools: {args.agents} agents x {args.turns} tool turns x 2 tools "
        f"(SQLite, {dt.date.today()})\n",
        f"Command: `.venv/bin/python -m bench.bench_tools --agents {args.agents} --turns "
        f"{args.turns} --latency-ms {args.latency_ms:.0f} --tool-ms {args.tool_ms:.0f} --runs "
        f"{args.runs}` (simulator at {args.latency_ms:.0f} ms, the example MCP server with "
        f"{args.tool_ms:.0f} ms tools over stdio and over streamable HTTP, `serve` on SQLite "
        f"and this client, separate processes on one 2-core machine; medians of {args.runs} "
        "runs).\n",
        f"- {calls} tool calls and {args.agents * (args.turns + 1)} gateway calls per swarm; "
        "each server allows 32 calls in flight (`max_concurrency`), the rest queue;",
        f"- *critical path* = one agent's chain, {args.turns + 1} gateway calls + "
        f"{args.turns} tool latencies = {ideal:.3f} s; *longest agent* = the longest subtask "
        "latency the swarm measured (its turns, tool calls and commits).\n",
        "| end-to-end s | swarm wall s | longest agent s | critical path s "
        "| end-to-end / critical path | swarm wall / critical path |",
        "|---|---|---|---|---|---|",
        f"| {e2e:.3f} | {swall:.3f} | {longest:.3f} | {ideal:.3f} | {e2e / ideal:.2f} "
        f"| {swall / ideal:.2f} |",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
