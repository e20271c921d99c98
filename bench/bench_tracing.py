"""Tracing overhead: the same N-agent fan-out through two `swarm-api serve` processes in one
run, one exporting every span over OTLP/HTTP to a receiver process, one without OTEL_*; runs
alternate so both see the same machine. Prints its figures (bench/RESULTS.md's "Other
workloads" row is updated from them).

    .venv/bin/python -m bench.bench_tracing [--agents 100] [--latency-ms 200] [--runs 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bench_fanout import run_swarm
from tests.support import free_port, process, wait_http

COLLECTOR = Path(__file__).resolve().parents[1] / "tests" / "otlp_collector.py"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--latency-ms", type=float, default=200)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    sim_port, off_port, on_port, otlp_port = (free_port() for _ in range(4))
    sim = f"http://127.0.0.1:{sim_port}/v1"
    off, on = f"http://127.0.0.1:{off_port}", f"http://127.0.0.1:{on_port}"
    base = {"SWARM_GATEWAY_URL": sim, "SWARM_AUTO_MIGRATE": "1"}
    collector = subprocess.Popen([sys.executable, str(COLLECTOR), str(otlp_port),
                                  str(work / "spans.jsonl")])
    walls: dict[str, list[float]] = {"off": [], "on": []}
    try:
        wait_http(f"http://127.0.0.1:{otlp_port}/")
        with process(["simulator", "--port", str(sim_port)],
                     {"SWARM_SIM_LATENCY_MS": str(args.latency_ms)}, f"{sim}/models",
                     work / "sim.log"), \
             process(["serve", "--port", str(off_port)],
                     {**base, "SWARM_DATABASE_URL": f"sqlite+aiosqlite:///{work}/off.db"},
                     f"{off}/readyz", work / "off.log"), \
             process(["serve", "--port", str(on_port)],
                     {**base, "SWARM_DATABASE_URL": f"sqlite+aiosqlite:///{work}/on.db",
                      "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}"},
                     f"{on}/readyz", work / "on.log"):
            for api in (off, on):
                run_swarm(api, args.agents, "synthesize")  # warm-up
            for _ in range(args.runs):
                for label, api in (("off", off), ("on", on)):
                    walls[label].append(run_swarm(api, args.agents, "synthesize")[0])
    finally:
        collector.terminate()
        collector.wait(10)
    spans = sum(1 for _ in (work / "spans.jsonl").open()) if (work / "spans.jsonl").exists() \
        else 0
    floor = 2 * args.latency_ms / 1000  # workers, then the synthesizer
    m_off, m_on = statistics.median(walls["off"]), statistics.median(walls["on"])
    lines = [
        f"\n## Tracing overhead: {args.agents} agents + synthesis at {args.latency_ms:.0f} ms "
        f"({dt.date.today()})\n",
        f"Command: `.venv/bin/python -m bench.bench_tracing --agents {args.agents} "
        f"--latency-ms {args.latency_ms:.0f} --runs {args.runs}` (two `serve` processes on "
        "SQLite, the simulator and an OTLP/HTTP receiver process; runs alternate; medians).\n",
        "| tracing | end-to-end s | over the floor (2 x latency) |",
        "|---|---|---|",
        f"| off (no OTEL_*) | {m_off:.3f} | {m_off / floor:.3f} |",
        f"| on (OTLP/HTTP, every span exported; {spans} spans received) | {m_on:.3f} | "
        f"{m_on / floor:.3f} |",
        f"\nOn over off: **{m_on / m_off:.3f}**.",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
