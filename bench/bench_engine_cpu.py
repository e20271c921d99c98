"""The engine's CPU per subtask, A/B between `swarm-api` builds in one run: each build's `serve`
(on its own throwaway PostgreSQL database, SPEC §8's limits lifted) runs the same wide swarm at
0 ms gateway latency (or `--latency-ms`), builds alternating, and the server's user+system
CPU seconds (from /proc) are divided by the subtasks; so are PostgreSQL's (every `postgres`
process: on 2 cores its CPU is taken from the same two). CPU, unlike wall time, hardly moves
with other load.

    .venv/bin/python -m bench.bench_engine_cpu --cli base=/path/to/swarm-api \\
        --cli new=.venv/bin/swarm-api [--agents 1000] [--in-flight 64] [--latency-ms 0] \\
        [--rounds 2] [--swarms 1] [--profile DIR [--profile-swarms 8]]

`--swarms K`: K such swarms one after another in each round's measured window (the figures per
subtask over all of them: a longer window, less noise from the machine's other load).

`--profile DIR`: after each round's measured swarm (so its figures are not the profiler's),
py-spy samples `serve` (`--gil`: Python CPU) over `--profile-swarms` more of the same swarms,
one raw profile per build (`<name>.raw`, the rounds appended), its top frames printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.builds import add_builds
from bench.builds import builds as bench_builds
from bench.cpu import postgres_cpu_s
from bench.profiles import profiled, top_frames
from bench.service import serve_db
from bench.table_rows import run_swarm, swarm_body
from tests.support import free_port, process

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def one_round(cli: str, agents: int, in_flight: int, latency_ms: float, work: Path,
              profile: Path | None = None, profile_swarms: int = 0, swarms: int = 1
              ) -> tuple[float, float, float]:
    tenants = work / "tenants.toml"
    tenants.write_text("[defaults]\n")  # a file naming no limit: none of SPEC §8's applies
    sim_port, api_port = free_port(), free_port()
    sim, api = f"http://127.0.0.1:{sim_port}/v1", f"http://127.0.0.1:{api_port}"
    with serve_db("swarm_cpu") as db:
        env = {**db, "SWARM_GATEWAY_URL": sim, "SWARM_MAX_INFLIGHT": "256",
               "SWARM_TENANTS_FILE": str(tenants)}
        with process(["simulator", "--port", str(sim_port)], {"SWARM_SIM_LATENCY_MS": "0"},
                     f"{sim}/models", work / "sim.log"), \
             process(["serve", "--port", str(api_port)], env, f"{api}/readyz", work / "api.log",
                     cli=cli) as serve:
            async def go() -> tuple[float, float, float]:
                async with httpx.AsyncClient(base_url=api, timeout=600) as c:
                    await run_swarm(c, swarm_body(50, 0, "none", in_flight))  # warm
                    before, db, t0 = cpu_s(serve.pid), postgres_cpu_s(), time.perf_counter()
                    for _ in range(swarms):
                        await run_swarm(c, swarm_body(agents, latency_ms, "none", in_flight))
                    got = (cpu_s(serve.pid) - before, postgres_cpu_s() - db,
                           time.perf_counter() - t0)
                    if profile is not None:
                        with profiled(serve.pid, work / "spy.raw"):
                            for _ in range(profile_swarms):
                                await run_swarm(c, swarm_body(agents, latency_ms, "none",
                                                              in_flight))
                    return got
            got = asyncio.run(go())
    if profile is not None:  # this round's samples added to the build's
        with profile.open("a") as out:
            out.write((work / "spy.raw").read_text())
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    add_builds(ap, "a build of swarm-api to measure (repeatable)", required=True)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--latency-ms", type=float, default=0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--swarms", type=int, default=1)
    ap.add_argument("--profile", default="", help="directory for py-spy raw profiles")
    ap.add_argument("--profile-swarms", type=int, default=8)
    args = ap.parse_args()
    spy = Path(args.profile) if args.profile else None
    if spy is not None:
        spy.mkdir(parents=True, exist_ok=True)
    builds = bench_builds(args)
    cpu: dict[str, list[float]] = {n: [] for n in builds}
    db: dict[str, list[float]] = {n: [] for n in builds}
    wall: dict[str, list[float]] = {n: [] for n in builds}
    for _ in range(args.rounds):
        for name, cli in builds.items():
            c, d, w = one_round(cli, args.agents, args.in_flight, args.latency_ms,
                                Path(tempfile.mkdtemp()), spy and spy / f"{name}.raw",
                                args.profile_swarms, args.swarms)
            n = args.agents * args.swarms
            cpu[name].append(c / n * 1000)
            db[name].append(d / n * 1000)
            wall[name].append(n / w)
    print(f"{args.swarms} x {args.agents} agents at {args.latency_ms:g} ms, "
          f"{args.in_flight} in flight, "
          f"{args.rounds} rounds, "
          f"1-min load {os.getloadavg()[0]:.1f}")
    for name in builds:
        print(f"  {name}: serve CPU {statistics.median(cpu[name]):.2f} ms/subtask "
              f"({', '.join(f'{x:.2f}' for x in cpu[name])}), PostgreSQL CPU "
              f"{statistics.median(db[name]):.2f} ms/subtask "
              f"({', '.join(f'{x:.2f}' for x in db[name])}), "
              f"{statistics.median(wall[name]):.0f} subtasks/s")
    for name in builds if spy is not None else ():
        print(f"\n{name}.raw:")
        for frame, own, incl in top_frames(spy / f"{name}.raw", 30):
            print(f"  {own:5.1f}% self {incl:5.1f}% incl  {frame}")


if __name__ == "__main__":
    main()
