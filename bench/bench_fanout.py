"""Fan-out overhead: a 100-agent swarm against the simulator (its own process, 500 ms per call)
through a real `swarm-api serve` process. Reports end-to-end wall time / the DAG's critical path
(target <= 1.05) and appends the figures to bench/RESULTS.md.

    .venv/bin/python bench/bench_fanout.py [--agents 100] [--latency-ms 500] [--postgres URL]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench._procs import free_port, process

RESULTS = Path(__file__).with_name("RESULTS.md")


def run_once(api: str, agents: int, strategy: str) -> dict[str, Any]:
    body = {"task": "benchmark fan-out",
            "agents": [{"name": f"agent_{i}", "system_prompt": f"You are agent {i}."}
                       for i in range(agents)],
            "synthesis": {"strategy": strategy}, "max_tokens": 200,
            "limits": {"concurrency": agents}}
    t0 = time.perf_counter()
    r = httpx.post(f"{api}/swarms", json=body, timeout=30)
    r.raise_for_status()
    swarm_id = r.json()["id"]
    while True:
        data: dict[str, Any] = httpx.get(f"{api}/swarms/{swarm_id}", params={"wait": 30},
                                         timeout=40).json()
        if data["status"] in ("succeeded", "failed", "cancelled"):
            break
    data["client_wall_s"] = time.perf_counter() - t0
    assert data["status"] == "succeeded", data["error"]
    return data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--latency-ms", type=float, default=500)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--postgres", help="postgresql+asyncpg:// URL (migrated) instead of SQLite")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    sim_port, api_port = free_port(), free_port()
    db = args.postgres or f"sqlite+aiosqlite:///{work}/bench.db"
    sim_env = {"SWARM_SIM_LATENCY_MS": str(args.latency_ms)}
    api_env = {"SWARM_DATABASE_URL": db, "SWARM_GATEWAY_URL": f"http://127.0.0.1:{sim_port}/v1",
               "SWARM_AUTO_MIGRATE": "1"}
    api = f"http://127.0.0.1:{api_port}"
    rows = []
    with process(["simulator", "--port", str(sim_port)], sim_env,
                 f"http://127.0.0.1:{sim_port}/v1/models", work / "sim.log"), \
         process(["serve", "--port", str(api_port)], api_env, f"{api}/readyz",
                 work / "api.log"):
        run_once(api, 10, "none")  # warm-up: connections, caches
        for strategy in ("none", "synthesize"):
            for _ in range(args.runs):
                d = run_once(api, args.agents, strategy)
                t = d["timing"]
                rows.append((strategy, d["client_wall_s"], t["wall_s"], t["critical_path_s"],
                             d["client_wall_s"] / t["critical_path_s"],
                             t["wall_s"] / t["critical_path_s"]))
    print(f"{'strategy':<11} {'client wall':>11} {'swarm wall':>10} {'crit path':>9} "
          f"{'client/cp':>9} {'swarm/cp':>8}")
    for r in rows:
        print(f"{r[0]:<11} {r[1]:>11.3f} {r[2]:>10.3f} {r[3]:>9.3f} {r[4]:>9.3f} {r[5]:>8.3f}")
    summary = []
    for strategy in ("none", "synthesize"):
        sel = [r for r in rows if r[0] == strategy]
        summary.append((strategy, statistics.median(r[4] for r in sel),
                        statistics.median(r[5] for r in sel), max(r[4] for r in sel)))
    backend = "PostgreSQL" if args.postgres else "SQLite"
    section = [
        f"\n## Fan-out overhead: {args.agents} agents, simulator at {args.latency_ms:.0f} ms "
        f"({backend}, {dt.date.today()})\n",
        "Command: `.venv/bin/python bench/bench_fanout.py"
        + (" --postgres URL" if args.postgres else "") + f"` ({args.runs} runs per strategy, "
        "simulator and API as separate processes on this 2-core machine).\n",
        "`client/cp` = POST-to-terminal wall time seen by the client / the DAG's critical path "
        "(sum of the longest chain of subtask latencies); `swarm/cp` uses the swarm's own "
        "started→finished wall time.\n",
        "| synthesis | median client/cp | median swarm/cp | worst client/cp |",
        "|---|---|---|---|",
        *[f"| {s} | {a:.3f} | {b:.3f} | {c:.3f} |" for s, a, b, c in summary],
    ]
    with RESULTS.open("a") as f:
        f.write("\n".join(section) + "\n")
    print("\n".join(section))


if __name__ == "__main__":
    main()
