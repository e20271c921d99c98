"""Fan-out overhead: an N-agent swarm against the simulator (its own process, fixed latency)
through a real `swarm-api serve` process, compared with (a) the DAG's critical path and
(b) a bare `asyncio.gather` of the same N httpx calls to the same simulator — the script users
write by hand today, with no persistence, retries or budget. Prints its figures (bench/RESULTS.md's
"Other workloads" row is updated from them).

    .venv/bin/python -m bench.bench_fanout [--agents 100] [--latency-ms 500] [--runs 5]
                                           [--postgres URL]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support import free_port, process

TERMINAL = ("succeeded", "failed", "cancelled")


def run_swarm(api: str, agents: int, strategy: str) -> tuple[float, dict[str, Any]]:
    body = {"task": "benchmark fan-out",
            "agents": [{"name": f"agent_{i}", "system_prompt": f"You are agent {i}."}
                       for i in range(agents)],
            "synthesis": {"strategy": strategy}, "max_tokens": 200,
            "limits": {"concurrency": agents}}
    with httpx.Client(timeout=40) as c:
        t0 = time.perf_counter()
        swarm_id = c.post(f"{api}/swarms", json=body).raise_for_status().json()["id"]
        while True:
            data: dict[str, Any] = c.get(f"{api}/swarms/{swarm_id}", params={"wait": 30}).json()
            if data["status"] in TERMINAL:
                break
        wall = time.perf_counter() - t0
    assert data["status"] == "succeeded", data["error"]
    return wall, data


async def bare_gather(sim: str, agents: int) -> float:
    """The hand-written baseline: one AsyncClient, one pool, asyncio.gather."""
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=agents), timeout=60) as c:
        async def one(i: int) -> None:
            r = await c.post(f"{sim}/chat/completions", json={
                "model": "kimi-k2.5", "max_tokens": 200,
                "messages": [{"role": "system", "content": f"You are agent {i}."},
                             {"role": "user", "content": "benchmark fan-out"}]},
                headers={"Idempotency-Key": f"bare:{time.time_ns()}:{i}"})
            r.raise_for_status()
            r.json()
        await one(-1)  # open a connection first, like the service's warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(agents)))
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--latency-ms", type=float, default=500)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--postgres", help="a migrated postgresql+asyncpg:// URL instead of SQLite")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    sim_port, api_port = free_port(), free_port()
    sim = f"http://127.0.0.1:{sim_port}/v1"
    api = f"http://127.0.0.1:{api_port}"
    api_env = {"SWARM_DATABASE_URL": args.postgres or f"sqlite+aiosqlite:///{work}/bench.db",
               "SWARM_GATEWAY_URL": sim, "SWARM_AUTO_MIGRATE": "1"}
    rows: list[tuple[str, float, float, float, float]] = []
    with process(["simulator", "--port", str(sim_port)],
                 {"SWARM_SIM_LATENCY_MS": str(args.latency_ms)}, f"{sim}/models",
                 work / "sim.log"), \
         process(["serve", "--port", str(api_port)], api_env, f"{api}/readyz",
                 work / "api.log"):
        run_swarm(api, args.agents, "none")  # warm-up: connections, caches
        for _ in range(args.runs):
            for strategy in ("none", "synthesize"):
                wall, d = run_swarm(api, args.agents, strategy)
                t = d["timing"]
                rows.append((strategy, wall, t["wall_s"], t["critical_path_s"], 0.0))
            bare = asyncio.run(bare_gather(sim, args.agents))
            rows.append(("bare gather", bare, bare, args.latency_ms / 1000, 0.0))
    print(f"{'what':<12} {'client wall':>11} {'swarm wall':>10} {'crit path':>9} {'wall/cp':>7}")
    for what, wall, swall, cp, _ in rows:
        print(f"{what:<12} {wall:>11.3f} {swall:>10.3f} {cp:>9.3f} {wall / cp:>7.3f}")

    def med(what: str, i: int) -> float:
        return statistics.median(float(r[i]) for r in rows if r[0] == what)

    def med_ratio(what: str) -> float:
        return statistics.median(r[1] / r[3] for r in rows if r[0] == what)

    bare_wall = med("bare gather", 1)
    backend = "PostgreSQL" if args.postgres else "SQLite"
    lines = [
        f"\n## Fan-out: {args.agents} agents, simulator at {args.latency_ms:.0f} ms "
        f"({backend}, {dt.date.today()})\n",
        "Command: `.venv/bin/python -m bench.bench_fanout"
        + (" --postgres URL" if args.postgres else "")
        + f" --agents {args.agents} --latency-ms {args.latency_ms:.0f} --runs {args.runs}` "
        "(simulator, API and this client as separate processes on one 2-core machine; medians "
        f"of {args.runs} runs).\n",
        "- *end-to-end* = POST → terminal as the client sees it (creation, claim, calls, "
        "commits, the `?wait=` answer); *critical path* = the longest chain of subtask "
        "latencies the swarm itself measured (each includes its HTTP round trip);",
        "- *bare gather* = the same calls from one `httpx.AsyncClient` with `asyncio.gather`, "
        "no persistence, retries or budget (its critical path is the simulator latency).\n",
        "| run | end-to-end s | swarm wall s | critical path s | end-to-end / critical path "
        "| end-to-end / bare gather |",
        "|---|---|---|---|---|---|",
    ]
    for what in ("none", "synthesize"):
        lines.append(f"| synthesis `{what}` | {med(what, 1):.3f} | {med(what, 2):.3f} | "
                     f"{med(what, 3):.3f} | {med_ratio(what):.3f} | "
                     f"{med(what, 1) / bare_wall:.2f} |")
    lines.append(f"| bare gather | {bare_wall:.3f} | - | {args.latency_ms / 1000:.3f} | "
                 f"{med_ratio('bare gather'):.3f} | 1.00 |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
