"""`make bench`: the performance table (issues 14 and 53), each figure beside its peer measured
in the same run, against one simulator process and one `swarm-api serve` on a throwaway
PostgreSQL; rewritten in place as bench/RESULTS.md's "The performance table" section.

    .venv/bin/python -m bench.bench_table [--runs 5] [--quick] [--cli NAME=PATH ...]

Rows: fan-out overhead (100 agents + synthesis at 500 ms, over the floor 2 x 500 ms, beside a
bare `asyncio.gather` script on httpx and on aiohttp, and LangGraph `Send`), throughput at 0 ms
with 64 in flight (over a bare single-pool gather on httpx, and over one on aiohttp), one
1,000-agent swarm and 50 concurrent 100-agent swarms at 200 ms with 256 in flight (over their
floors, each beside a bare aiohttp gather of the same calls; bench/table_rows.py), serve's
memory per in-flight call and its RSS idle against after those swarms; the tool row (100
agents, 2 turns at 200 ms and a 50 ms MCP tool, over streamable HTTP and stdio;
bench/bench_tool_row.py's `measure`, beside the same agents as a gather script with the MCP
SDK's `Client`, bench/peer_tools.py); `POST /swarms` under 200 concurrent clients and from one
client, with the engine in the process, API-only, split, and with every SPEC §8 quota checked
beside the same without quotas (bench/table_creation.py).
With `--cli`, each named build runs every row in turn (before/after in one run), one column
per build. `--quick` is a smoke run: smaller sizes, RESULTS.md untouched.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench import bench_tool_row
from bench.builds import add_builds
from bench.builds import builds as bench_builds
from bench.service import serve_db, tenants_file
from bench.table_creation import (
    CLIENTS,
    READY_S,
    api_only_rows,
    engine_rows,
    quota_pair,
    quota_rows,
)
from bench.table_rows import measure, spread, workers_row
from tests.results_md import Row, rewrite, section
from tests.support import CLI, free_port, process

RESULTS = Path(__file__).with_name("RESULTS.md")


def table(cli: str, runs: int, quick: bool, work: Path) -> list[Row]:
    """Every row for one build of `swarm-api` (the simulator is always this checkout's)."""
    sim_port, api_port, api3_port = free_port(), free_port(), free_port()
    sim, api = f"http://127.0.0.1:{sim_port}/v1", f"http://127.0.0.1:{api_port}"
    api3 = f"http://127.0.0.1:{api3_port}"
    with serve_db("swarm_bench") as db:
        env = {**db, "SWARM_GATEWAY_URL": sim, "SWARM_MAX_INFLIGHT": "256",
               "SWARM_MAX_RUNNING_SWARMS": "64",
               "SWARM_TENANTS_FILE": str(tenants_file(work))}
        with process(["simulator", "--port", str(sim_port)], {"SWARM_SIM_LATENCY_MS": "0"},
                     f"{sim}/models", work / "sim.log"):
            with process(["serve", "--port", str(api_port)], env, f"{api}/readyz",
                         work / "api.log", cli=cli, ready_s=READY_S) as serve:
                engine = asyncio.run(measure(api, sim, serve.pid, runs, quick))
                creation = asyncio.run(engine_rows(api, quick))
            # the many-swarm row again from two engine processes sharing 256 calls in flight
            with serve_db("swarm_bench") as db3, \
                 process(["serve", "--workers", "2", "--port", str(api3_port)],
                         {**env, **db3, "SWARM_MAX_INFLIGHT": "128"},
                         f"{api3}/readyz", work / "api3.log", cli=cli, ready_s=READY_S):
                engine.insert(-1, asyncio.run(workers_row(api3, quick, runs)))
            creation += api_only_rows(env, work, cli, quick)
            pairs = {client: quota_pair(env, work, cli, quick, runs, client)
                     for client in CLIENTS}
            creation += quota_rows(pairs, quick, runs)
    return [*engine, tool_row(cli, runs, quick, work / "tools"), *creation]


def tool_row(cli: str, runs: int, quick: bool, work: Path) -> Row:
    """100 tool-using agents over streamable HTTP and stdio, the build's MCP defaults, with a
    simulator of their own at 200 ms; a build that cannot run it gets its reason instead."""
    agents, latency_ms, tool_ms = (30 if quick else 100), 200.0, 50.0
    what = (f"{agents} tool-using agents (a turn calling one {tool_ms:.0f} ms MCP tool, then a "
            f"turn; {latency_ms:.0f} ms a call), wall over floor "
            f"({(2 * latency_ms + tool_ms) / 1000:.2f} s), median of {runs}")
    work.mkdir(parents=True, exist_ok=True)
    try:
        both = bench_tool_row.measure(work, [None], agents=agents, latency_ms=latency_ms,
                                      tool_ms=tool_ms, runs=runs, cli=cli, peer=True)
        got, peer = both[None], both[bench_tool_row.PEER]
    except Exception as exc:  # the build's own failure: the table goes on without the row
        traceback.print_exc()
        return Row(what, f"not measured ({type(exc).__name__}: see stderr)", "-",
                   "<= 1.25x both")
    names = {"http": "streamable HTTP", "stdio": "stdio"}

    def cell(runs: dict[str, list[tuple[float, float]]], mark: str) -> str:
        """Each transport's median ratio (marked) and the runs' range."""
        return "; ".join(f"{names[t]} {mark}{statistics.median(r for r, _ in runs[t]):.2f}x"
                         f"{mark} ({spread([r for r, _ in runs[t]], 'x')})" for t in names)

    return Row(what, cell(got, "**"), "a gather script with the MCP SDK's `Client` (one a "
               "server) and aiohttp, persisting nothing: " + cell(peer, ""), "<= 1.25x both")


def host_speed() -> float:
    """Seconds a pure-Python loop of 10^7 additions takes here, best of three: a shared host's
    speed moves from day to day and within minutes, and every CPU-bound row with it."""
    best = float("inf")
    for _ in range(3):
        t0, total = time.perf_counter(), 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.perf_counter() - t0)
    return best


def intro(args: argparse.Namespace, loads: tuple[float, float], speed: float) -> str:
    options = f"{' --quick' if args.quick else ''}" + "".join(
        f" --cli {name}={path}" for name, path in args.cli)
    builds = ("" if len(args.cli) < 2 else
              " Each build runs every row in turn, one column each: a cell is that build's "
              "figure and the peers of its own run.")
    return (
        f"Command: `make bench` (= `.venv/bin/python -m bench.bench_table --runs {args.runs}"
        f"{options}`), {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, 1-min load average "
        f"{loads[0]:.1f} at the start and {loads[1]:.1f} at the end; the host's speed: a "
        f"Python loop of 10^7 additions in {speed:.2f} s (best of 3, before the rows: a "
        "shared host's speed moves from day to day, and CPU-bound rows with it). One "
        "simulator process "
        "(latency per request by directive), one `swarm-api serve` on a throwaway PostgreSQL "
        "database and the peers from the bench process, all on one machine "
        f"({os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}). `serve` runs with a SWARM_TENANTS_FILE lifting SPEC "
        "§8's rate, active-swarm and daily limits (`bench/service.py` BENCH_TENANTS; "
        "budgets as SPEC's defaults): without it the load rows measure the token bucket "
        "(600/min, 429s); the quota rows set every quota instead and reach none "
        "(CHECKED_TENANTS). The tool row has a simulator of its own at 200 ms and the "
        "example MCP server over stdio and streamable HTTP (`bench/bench_tool_row.py`), "
        "its peer the same agents as a gather script (`bench/peer_tools.py`). "
        "Each figure is the median of its runs, each run alternating with its peer, with "
        "their range; errors are counted by kind (HTTP status, or the client's exception). "
        "Targets are issue 53's where it sets one (issue 14's in brackets)." + builds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="smaller sizes, bench/RESULTS.md untouched (a smoke run)")
    add_builds(ap, "compare builds: each one's `swarm-api` runs every row, in order, "
                   "one column each (default: this checkout's)")
    args = ap.parse_args()
    speed, start = host_speed(), os.getloadavg()[0]
    results: dict[str, list[Row]] = {}
    # this checkout's build is the one unnamed column
    for name, cli in bench_builds(args, ("", CLI)).items():
        results[name] = table(cli, args.runs, args.quick,
                              Path(tempfile.mkdtemp(prefix="bench-table-")))
        print(f"build {name or 'this'}: done", file=sys.stderr, flush=True)
    text = section(intro(args, (start, os.getloadavg()[0]), speed), results)
    print(text)
    if not args.quick:  # a smoke run's figures are not results
        RESULTS.write_text(rewrite(RESULTS.read_text(), text))
        print(f"rewrote the performance table of {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
