"""What planning costs: a task-only swarm (planner -> the simulator's default 4-subtask plan ->
synthesis) against the same DAG given as explicit agents, through real `serve` and simulator
processes. Planning should add one call to the critical path and nothing else. Prints its
figures (bench/RESULTS.md's "Other workloads" row is updated from them).

    .venv/bin/python -m bench.bench_planning [--latency-ms 300] [--runs 5]
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

from tests.support import free_port, process

TASK = "Assess the migration of a payments ledger to a new database"
# the simulator's default plan for any task: three independent subtasks, one joining two
PLAN = [("research_1", []), ("analysis_2", []), ("review_3", []),
        ("report_4", ["research_1", "analysis_2"])]


def run(api: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    with httpx.Client(timeout=60) as c:
        t0 = time.perf_counter()
        swarm_id = c.post(f"{api}/swarms", json=body).raise_for_status().json()["id"]
        while (data := c.get(f"{api}/swarms/{swarm_id}", params={"wait": 30}).json())[
                "status"] not in ("succeeded", "failed", "cancelled"):
            pass
        wall = time.perf_counter() - t0
    assert data["status"] == "succeeded", data["error"]
    return wall, data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency-ms", type=float, default=300)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-planning-"))
    sim_port, api_port = free_port(), free_port()
    sim, api = f"http://127.0.0.1:{sim_port}/v1", f"http://127.0.0.1:{api_port}"
    planned = {"task": TASK}
    explicit = {"task": TASK, "agents": [{"name": n, "depends_on": d} for n, d in PLAN]}
    walls: dict[str, list[float]] = {"planned": [], "explicit": []}
    paths: dict[str, list[float]] = {"planned": [], "explicit": []}
    calls: dict[str, int] = {}
    with process(["simulator", "--port", str(sim_port)],
                 {"SWARM_SIM_LATENCY_MS": str(args.latency_ms)}, f"{sim}/models",
                 work / "sim.log"), \
         process(["serve", "--port", str(api_port)],
                 {"SWARM_DATABASE_URL": f"sqlite+aiosqlite:///{work}/b.db",
                  "SWARM_GATEWAY_URL": sim}, f"{api}/readyz", work / "api.log"):
        run(api, explicit)  # warm-up
        for _ in range(args.runs):
            for name, body in (("planned", planned), ("explicit", explicit)):
                wall, data = run(api, body)
                walls[name].append(wall)
                paths[name].append(data["timing"]["critical_path_s"])
                calls[name] = data["usage"]["gateway_calls"]
    med = {k: statistics.median(v) for k, v in walls.items()}
    cp = {k: statistics.median(v) for k, v in paths.items()}
    added = med["planned"] - med["explicit"]
    lines = [
        f"\n## Planning cost: task-only vs the same DAG as explicit agents ({dt.date.today()})\n",
        f"Command: `.venv/bin/python -m bench.bench_planning --latency-ms "
        f"{args.latency_ms:.0f} --runs {args.runs}` (simulator at {args.latency_ms:.0f} ms and "
        "`serve` on SQLite as separate processes; medians).\n",
        "| swarm | gateway calls | end-to-end s | critical path s | end-to-end / critical path |",
        "|---|---|---|---|---|",
        *(f"| {k} | {calls[k]} | {med[k]:.3f} | {cp[k]:.3f} | {med[k] / cp[k]:.3f} |"
          for k in ("explicit", "planned")),
        "",
        f"Planning added {added:.3f} s end to end = {added / (args.latency_ms / 1000):.2f} "
        f"simulator calls of {args.latency_ms:.0f} ms (target: 1 call, nothing else).",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
