"""The tool row: 100 tool-using agents, each a turn that calls one 50 ms MCP tool and a turn
that answers (2 gateway calls at 200 ms), over streamable HTTP and over stdio, wall ÷ floor.

The floor is one agent's chain, 2 x latency + the tool's latency (0.45 s): every agent runs at
once (limits.concurrency and each server's max_concurrency = the agents), so the wall above
it is what the service and the transports add. The simulator (the stub gateway) and each MCP
server run in their own processes, `serve` on PostgreSQL. One `serve` per SWARM_MCP_HTTP_SESSIONS
value in `--sessions` (1 is one session per server), all up at once and their swarms
interleaved, so before and after come from one run and one stretch of the machine's load; the
stdio server has one pipelined session whatever the value. With `--cli`, each build runs its own
checkout's example server (`<checkout>/.venv/bin/swarm-api` beside `<checkout>/examples/`).
Each run also runs the row's peer, the same agents as a hand-written gather script on the MCP
SDK's `Client` (bench/peer_tools.py; `--no-peer` leaves it out). Prints medians, writes
nothing; `make bench` (bench/bench_table.py) runs `measure` for its tool row with the build's
default.

    .venv/bin/python -m bench.bench_tool_row [--agents 100] [--runs 5] [--sessions 1,4]
        [--cli before=/work/wt/base/.venv/bin/swarm-api --cli after=.venv/bin/swarm-api]
        [--no-peer]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from mcp import StdioServerParameters

from bench.bench_tools import run_swarm, wait_ready
from bench.builds import add_builds
from bench.builds import builds as bench_builds
from bench.cpu import cpu_s
from bench.peer_tools import tool_gather
from bench.profiles import start_spy, top_frames
from bench.service import serve_db, tenants_file
from tests.mcp_servers import SERVER, HttpServer
from tests.support import CLI, free_port, process

TRANSPORTS = {"http": ("web.lookup",), "stdio": ("docs.lookup",)}
PEER = "peer"  # measure's key of the hand-written script's runs


def example_server(cli: str) -> Path:
    """The example MCP server of the checkout whose venv holds `cli` (`<checkout>/.venv/bin/
    swarm-api`), else this checkout's: each build is measured with its own server."""
    theirs = Path(cli).resolve().parents[2] / "examples" / "mcp" / "server.py"
    return theirs if theirs.is_file() else SERVER


@contextmanager
def serving(work: Path, sim: str, sessions: int | None, agents: int, tool_ms: float,
            web: HttpServer, cli: str = CLI, label: str | None = None
            ) -> Iterator[tuple[str, int, str]]:
    """A `serve` of `cli` (its URL, pid and database URL) with SWARM_MCP_HTTP_SESSIONS=
    `sessions` (None: the build's default), warmed up; its stdio server is `cli`'s checkout's
    example server."""
    slots = {"max_concurrency": agents}
    label = label or ("default" if sessions is None else str(sessions))
    config = work / f"mcp-{label}.json"
    config.write_text(json.dumps({"mcpServers": {
        "docs": {"command": sys.executable, "args": [str(example_server(cli))],
                 "env": {"EXAMPLE_MCP_DELAY_MS": str(tool_ms)}, **slots},
        "web": {"url": web.url, **slots}}}))
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    db_name = f"swarm_tools_{label.replace('-', '_')}"
    with serve_db(db_name) as db, (work / f"api-{label}.log").open("wb") as log:
        env = {**os.environ, **db, "SWARM_GATEWAY_URL": sim, "SWARM_MCP_CONFIG": str(config),
               "SWARM_MAX_INFLIGHT": "256", "SWARM_TENANTS_FILE": str(tenants_file(work))}
        if sessions is not None:
            env["SWARM_MCP_HTTP_SESSIONS"] = str(sessions)
        serve = subprocess.Popen([cli, "serve", "--port", str(api_port)], env=env,
                                 stdout=log, stderr=subprocess.STDOUT, cwd=work)
        try:
            wait_ready(f"{api}/readyz", serve)
            for tools in TRANSPORTS.values():  # warm-up: connections, sessions, caches
                run_swarm(api, agents, 1, tools)
            yield api, serve.pid, db["SWARM_DATABASE_URL"]
        finally:
            serve.terminate()
            serve.wait(30)


# per variant (a SWARM_MCP_HTTP_SESSIONS value, None the build's default; with `clis`, a
# (build name, value) pair), per transport: (wall ÷ floor, serve's CPU seconds) of each run
ToolRuns = dict[Any, dict[str, list[tuple[float, float]]]]


def spied(pid: int, out: Path | None) -> Callable[[], None]:
    """py-spy (sampling, collapsed stacks) on `pid` from now; the returned function stops it
    (nothing runs when `out` is None)."""
    if out is None:
        return lambda: None
    recording = start_spy(pid, out)

    def stop() -> None:
        if recording.poll() is None:
            recording.send_signal(signal.SIGINT)
            recording.wait(60)
    return stop


def measure(work: Path, pool_sizes: list[int | None], *, agents: int = 100,
            latency_ms: float = 200, tool_ms: float = 50, runs: int = 5, cli: str = CLI,
            spy: Path | None = None, clis: dict[str, str] | None = None,
            peer: bool = False) -> ToolRuns:
    """The row's runs: a simulator at `latency_ms`, the streamable-HTTP example server (one
    per build's checkout), and a `serve` of `cli` (of each of `clis`) per pool size, all up at
    once, their swarms interleaved run by run. Serve's CPU and the profile stop at the swarm's
    end (the transcript checks after it are not the swarm's). `peer`: each run also runs the
    hand-written script (bench/peer_tools.py) on this checkout's example server, under the
    key PEER, its CPU the script's own."""
    sim_port = free_port()
    sim = f"http://127.0.0.1:{sim_port}/v1"
    floor = (2 * latency_ms + tool_ms) / 1000
    variants: dict[Any, tuple[str, int | None]] = (
        {(name, n): (path, n) for name, path in clis.items() for n in pool_sizes}
        if clis else {n: (cli, n) for n in pool_sizes})
    results: ToolRuns = {v: {t: [] for t in TRANSPORTS}
                         for v in [*variants, *([PEER] if peer else [])]}
    webs: dict[Path, HttpServer] = {}
    try:
        for path, _ in variants.values():
            server = example_server(path)
            if server not in webs:
                webs[server] = HttpServer(work / f"web-{len(webs)}.log", tool_ms, server)
        if peer and SERVER not in webs:
            webs[SERVER] = HttpServer(work / "web-peer.log", tool_ms, SERVER)
        web_url = webs[SERVER].url if peer else ""
        with ExitStack() as stack:
            stack.enter_context(process(
                ["simulator", "--port", str(sim_port)],
                {"SWARM_SIM_LATENCY_MS": str(latency_ms)}, f"{sim}/models", work / "sim.log"))
            serves = {v: stack.enter_context(serving(work, sim, n, agents, tool_ms,
                                                     webs[example_server(path)], path,
                                                     label=_label(v)))
                      for v, (path, n) in variants.items()}
            for i in range(runs):  # interleaved: a drift of the machine hits every variant
                for v, (api, pid, _) in serves.items():
                    for transport, tools in TRANSPORTS.items():
                        raw = (spy / f"serve-{_label(v)}-{transport}.raw"
                               if spy is not None and i == runs - 1 else None)
                        stop = spied(pid, raw)
                        cpu: list[float] = [cpu_s(pid)]

                        def ended(stop: Callable[[], None] = stop, cpu: list[float] = cpu,
                                  pid: int = pid) -> None:
                            cpu.append(cpu_s(pid))
                            stop()
                        try:
                            wall, _ = run_swarm(api, agents, 1, tools, on_end=ended)
                        finally:
                            stop()
                        results[v][transport].append((wall / floor, cpu[1] - cpu[0]))
                        print(f"{_label(v)} {transport}: {wall:.3f} s = "
                              f"{wall / floor:.2f}x floor, serve CPU "
                              f"{results[v][transport][-1][1]:.2f} s", flush=True)
                if peer:
                    peer_run(sim, web_url, tool_ms, agents, floor, results[PEER])
    finally:
        for web in webs.values():
            web.close()
    return results


def peer_run(sim: str, web_url: str, tool_ms: float, agents: int, floor: float,
             into: dict[str, list[tuple[float, float]]]) -> None:
    """One run of the hand-written script on each transport: (wall ÷ floor, its CPU)."""
    stdio = StdioServerParameters(command=sys.executable, args=[str(SERVER)],
                                  env={"EXAMPLE_MCP_DELAY_MS": str(tool_ms)})
    for transport, server in (("http", web_url), ("stdio", stdio)):
        cpu0 = time.process_time()
        wall = asyncio.run(tool_gather(sim, server, agents))
        into[transport].append((wall / floor, time.process_time() - cpu0))
        print(f"peer {transport}: {wall:.3f} s = {wall / floor:.2f}x floor", flush=True)


def _label(variant: Any) -> str:
    if isinstance(variant, tuple):
        name, n = variant
        return f"{name}-{n or 'default'}"
    return "default" if variant is None else str(variant)


def row_parser(runs: int) -> argparse.ArgumentParser:
    """The row's own arguments: its agents, the gateway's and the tool's latency, the runs."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--latency-ms", type=float, default=200)
    ap.add_argument("--tool-ms", type=float, default=50)
    ap.add_argument("--runs", type=int, default=runs)
    return ap


def main() -> None:
    ap = row_parser(runs=5)
    ap.add_argument("--sessions", default="1,4", help="SWARM_MCP_HTTP_SESSIONS values")
    add_builds(ap, "compare builds: each one's `swarm-api serve`, swarms interleaved")
    ap.add_argument("--no-peer", action="store_true",
                    help="leave out the hand-written script (bench/peer_tools.py)")
    ap.add_argument("--spy", type=Path, default=None,
                    help="directory for py-spy profiles of `serve` during each variant's last run")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tool-row-"))
    pool_sizes: list[int | None] = [int(v) for v in args.sessions.split(",")]
    results = measure(work, pool_sizes, agents=args.agents, latency_ms=args.latency_ms,
                      tool_ms=args.tool_ms, runs=args.runs, spy=args.spy,
                      clis=bench_builds(args) or None, peer=not args.no_peer)
    for raw in sorted(args.spy.glob("serve-*.raw")) if args.spy is not None else []:
        print(f"\n{raw.name}: frame, self %, inclusive % (Python CPU of `serve`)")
        for frame, own, incl in top_frames(raw, 15):
            print(f"  {own:5.1f} {incl:5.1f}  {frame}")
    print(f"\n{args.agents} agents x (turn, one {args.tool_ms:.0f} ms tool, turn) at "
          f"{args.latency_ms:.0f} ms; medians of {args.runs} runs")
    print("| build-SWARM_MCP_HTTP_SESSIONS | transport | wall / floor (runs) "
          "| serve CPU s (runs; the peer's: the script's own) |")
    print("|---|---|---|---|")
    for variant, by_transport in results.items():
        for transport, runs in by_transport.items():
            ratios = ", ".join(f"{r:.2f}" for r, _ in runs)
            cpus = ", ".join(f"{c:.2f}" for _, c in runs)
            print(f"| {_label(variant)} | {transport} | "
                  f"**{statistics.median(r for r, _ in runs):.2f}x** ({ratios}) | "
                  f"{statistics.median(c for _, c in runs):.2f} ({cpus}) |")


if __name__ == "__main__":
    main()
