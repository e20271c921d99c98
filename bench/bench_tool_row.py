"""The tool row: 100 tool-using agents, each a turn that calls one 50 ms MCP tool and a turn
that answers (2 gateway calls at 200 ms), over streamable HTTP and over stdio, wall ÷ floor.

The floor is one agent's chain, 2 x latency + the tool's latency (0.45 s): every agent runs at
once (limits.concurrency and each server's max_concurrency = the agents), so the wall above
it is what the service and the transports add. The simulator (the stub gateway) and each MCP
server run in their own processes, `serve` on PostgreSQL. One `serve` per SWARM_MCP_HTTP_SESSIONS
value in `--sessions` (1 is one session per server), so before and after come from one run;
the stdio server has one pipelined session whatever the value. Prints medians, appends nothing.

    .venv/bin/python -m bench.bench_tool_row [--agents 100] [--runs 5] [--sessions 1,4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bench_create import cpu_s, serve_db, tenants_file
from bench.bench_tools import run_swarm, wait_ready
from tests.mcp_servers import SERVER, HttpServer
from tests.support import CLI, free_port, process

TRANSPORTS = {"http": ("web.lookup",), "stdio": ("docs.lookup",)}


def one_serve(work: Path, sim: str, sessions: int, args: argparse.Namespace,
              web: HttpServer) -> dict[str, list[tuple[float, float]]]:
    """(wall ÷ floor, serve CPU s) of each run, by transport, alternating the transports."""
    slots = {"max_concurrency": args.agents}
    config = work / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "docs": {"command": sys.executable, "args": [str(SERVER)],
                 "env": {"EXAMPLE_MCP_DELAY_MS": str(args.tool_ms)}, **slots},
        "web": {"url": web.url, **slots}}}))
    floor = (2 * args.latency_ms + args.tool_ms) / 1000
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    out: dict[str, list[tuple[float, float]]] = {t: [] for t in TRANSPORTS}
    with serve_db("swarm_tools") as db, (work / f"api-{sessions}.log").open("wb") as log:
        env = {**os.environ, **db, "SWARM_GATEWAY_URL": sim, "SWARM_MCP_CONFIG": str(config),
               "SWARM_MCP_HTTP_SESSIONS": str(sessions), "SWARM_MAX_INFLIGHT": "256",
               "SWARM_TENANTS_FILE": str(tenants_file(work))}
        serve = subprocess.Popen([CLI, "serve", "--port", str(api_port)], env=env,
                                 stdout=log, stderr=subprocess.STDOUT, cwd=work)
        try:
            wait_ready(f"{api}/readyz", serve)
            for tools in TRANSPORTS.values():  # warm-up: connections, sessions, caches
                run_swarm(api, args.agents, 1, tools)
            for _ in range(args.runs):
                for transport, tools in TRANSPORTS.items():
                    before = cpu_s(serve.pid)
                    wall, _ = run_swarm(api, args.agents, 1, tools)
                    out[transport].append((wall / floor, cpu_s(serve.pid) - before))
                    print(f"sessions={sessions} {transport}: {wall:.3f} s = "
                          f"{wall / floor:.2f}x floor, serve CPU {out[transport][-1][1]:.2f} s",
                          flush=True)
        finally:
            serve.terminate()
            serve.wait(30)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--latency-ms", type=float, default=200)
    ap.add_argument("--tool-ms", type=float, default=50)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sessions", default="1,4", help="SWARM_MCP_HTTP_SESSIONS values")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tool-row-"))
    sim_port = free_port()
    sim = f"http://127.0.0.1:{sim_port}/v1"
    web = HttpServer(work / "web.log", delay_ms=args.tool_ms)
    results: dict[int, dict[str, list[tuple[float, float]]]] = {}
    try:
        with process(["simulator", "--port", str(sim_port)],
                     {"SWARM_SIM_LATENCY_MS": str(args.latency_ms)}, f"{sim}/models",
                     work / "sim.log"):
            for sessions in (int(v) for v in args.sessions.split(",")):
                results[sessions] = one_serve(work, sim, sessions, args, web)
    finally:
        web.close()
    print(f"\n{args.agents} agents x (turn, one {args.tool_ms:.0f} ms tool, turn) at "
          f"{args.latency_ms:.0f} ms; medians of {args.runs} runs")
    print("| SWARM_MCP_HTTP_SESSIONS | transport | wall / floor (runs) | serve CPU s |")
    print("|---|---|---|---|")
    for sessions, by_transport in results.items():
        for transport, runs in by_transport.items():
            ratios = ", ".join(f"{r:.2f}" for r, _ in runs)
            print(f"| {sessions} | {transport} | **{statistics.median(r for r, _ in runs):.2f}x** "
                  f"({ratios}) | {statistics.median(c for _, c in runs):.2f} |")


if __name__ == "__main__":
    main()
