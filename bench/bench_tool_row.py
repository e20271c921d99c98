"""The tool row: 100 tool-using agents, each a turn that calls one 50 ms MCP tool and a turn
that answers (2 gateway calls at 200 ms), over streamable HTTP and over stdio, wall ÷ floor.

The floor is one agent's chain, 2 x latency + the tool's latency (0.45 s): every agent runs at
once (limits.concurrency and each server's max_concurrency = the agents), so the wall above
it is what the service and the transports add. The simulator (the stub gateway) and each MCP
server run in their own processes, `serve` on PostgreSQL. One `serve` per SWARM_MCP_HTTP_SESSIONS
value in `--sessions` (1 is one session per server) and build in `--cli`, all up at once and
their swarms interleaved, so before and after come from one run and one stretch of the
machine's load; the stdio server has one pipelined session whatever the value. Prints medians,
appends nothing.

    .venv/bin/python -m bench.bench_tool_row [--agents 100] [--runs 5] [--sessions 1,4]
        [--cli main=/work/main/.venv/bin/swarm-api] [--cli this=.venv/bin/swarm-api]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bench.bench_create import cpu_s, profiled, serve_db, tenants_file, top_frames
from bench.bench_tools import run_swarm, wait_ready
from tests.mcp_servers import SERVER, HttpServer
from tests.support import CLI, free_port, process

TRANSPORTS = {"http": ("web.lookup",), "stdio": ("docs.lookup",)}


@contextmanager
def serving(work: Path, sim: str, variant: str, cli: str, sessions: int, agents: int,
            tool_ms: float, web: HttpServer) -> Iterator[tuple[str, int]]:
    """`cli serve` (its URL and pid) with SWARM_MCP_HTTP_SESSIONS=`sessions`, warmed up."""
    slots = {"max_concurrency": agents}
    config = work / f"mcp-{variant}.json"
    config.write_text(json.dumps({"mcpServers": {
        "docs": {"command": sys.executable, "args": [str(SERVER)],
                 "env": {"EXAMPLE_MCP_DELAY_MS": str(tool_ms)}, **slots},
        "web": {"url": web.url, **slots}}}))
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    with serve_db(f"swarm_tools_{sessions}") as db, \
            (work / f"api-{variant}.log").open("wb") as log:
        env = {**os.environ, **db, "SWARM_GATEWAY_URL": sim, "SWARM_MCP_CONFIG": str(config),
               "SWARM_MCP_HTTP_SESSIONS": str(sessions), "SWARM_MAX_INFLIGHT": "256",
               "SWARM_TENANTS_FILE": str(tenants_file(work))}
        serve = subprocess.Popen([cli, "serve", "--port", str(api_port)], env=env,
                                 stdout=log, stderr=subprocess.STDOUT, cwd=work)
        try:
            wait_ready(f"{api}/readyz", serve)
            for tools in TRANSPORTS.values():  # warm-up: connections, sessions, caches
                run_swarm(api, agents, 1, tools)
            yield api, serve.pid
        finally:
            serve.terminate()
            serve.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--latency-ms", type=float, default=200)
    ap.add_argument("--tool-ms", type=float, default=50)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sessions", default="1,4", help="SWARM_MCP_HTTP_SESSIONS values")
    ap.add_argument("--cli", action="append", default=[],
                    help="name=path of a build's swarm-api (repeatable; default this checkout)")
    ap.add_argument("--spy", type=Path, default=None,
                    help="directory for py-spy profiles of `serve` during each variant's last run")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tool-row-"))
    sim_port = free_port()
    sim = f"http://127.0.0.1:{sim_port}/v1"
    web = HttpServer(work / "web.log", delay_ms=args.tool_ms)
    floor = (2 * args.latency_ms + args.tool_ms) / 1000
    builds = {k: str(Path(v).absolute()) for k, v in (c.split("=", 1) for c in args.cli)} \
        or {"this": CLI}
    variants = {f"{b}/{n}": (cli, int(n)) for b, cli in builds.items()
                for n in args.sessions.split(",")}
    results: dict[str, dict[str, list[tuple[float, float]]]] = {
        v: {t: [] for t in TRANSPORTS} for v in variants}
    try:
        with ExitStack() as stack:
            stack.enter_context(process(
                ["simulator", "--port", str(sim_port)],
                {"SWARM_SIM_LATENCY_MS": str(args.latency_ms)}, f"{sim}/models",
                work / "sim.log"))
            serves = {v: stack.enter_context(serving(work, sim, v.replace("/", "-"), cli, n,
                                                     args.agents, args.tool_ms, web))
                      for v, (cli, n) in variants.items()}
            for i in range(args.runs):  # interleaved: a drift of the machine hits every variant
                for n, (api, pid) in serves.items():
                    for transport, tools in TRANSPORTS.items():
                        raw = (args.spy / f"serve-{n.replace('/', '-')}-{transport}.raw"
                               if args.spy is not None and i == args.runs - 1 else None)
                        with profiled(pid, raw):
                            before = cpu_s(pid)
                            wall, _ = run_swarm(api, args.agents, 1, tools)
                            results[n][transport].append((wall / floor, cpu_s(pid) - before))
                        print(f"{n} {transport}: {wall:.3f} s = {wall / floor:.2f}x "
                              f"floor, serve CPU {results[n][transport][-1][1]:.2f} s", flush=True)
    finally:
        web.close()
    for raw in sorted(args.spy.glob("serve-*.raw")) if args.spy is not None else []:
        print(f"\n{raw.name}: frame, self %, inclusive % (Python CPU of `serve`)")
        for frame, own, incl in top_frames(raw, 15):
            print(f"  {own:5.1f} {incl:5.1f}  {frame}")
    print(f"\n{args.agents} agents x (turn, one {args.tool_ms:.0f} ms tool, turn) at "
          f"{args.latency_ms:.0f} ms; medians of {args.runs} runs")
    print("| build / SWARM_MCP_HTTP_SESSIONS | transport | wall / floor (runs) | serve CPU s |")
    print("|---|---|---|---|")
    for sessions, by_transport in results.items():
        for transport, runs in by_transport.items():
            ratios = ", ".join(f"{r:.2f}" for r, _ in runs)
            print(f"| {sessions} | {transport} | **{statistics.median(r for r, _ in runs):.2f}x** "
                  f"({ratios}) | {statistics.median(c for _, c in runs):.2f} |")


if __name__ == "__main__":
    main()
