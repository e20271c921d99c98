"""The engine rows of `bench_table`, A/B between builds in alternating rounds, with `serve`'s CPU;
or, with `--anatomy`, where one 1,000-agent swarm's time goes (timestamps from the database);
or, with `--anatomy fanout`, where the 100-agent fan-out's does (5 runs, each build in turn).

    .venv/bin/python -m bench.bench_rows --cli before=/path/cli --cli after=/path/cli [--rounds 3]
    .venv/bin/python -m bench.bench_rows --cli now=/path/cli --anatomy [fanout]
    .venv/bin/python -m bench.bench_rows --cli now=/path/cli --quotas lifted,checked

`--quotas checked` runs a build with every SPEC §8 key set and none reached (`CHECKED_TENANTS`:
the tenant's daily cap among them, so each gateway call reserves and settles in the database,
as with SPEC's default limits) instead of `BENCH_TENANTS` (rate, active-swarm and daily limits
lifted, as `bench_table` runs); both in one run alternate like builds.

Rows per round: one 1,000-agent swarm at 200 ms (256 in flight) and 50 concurrent 100-agent
swarms at 200 ms, over their floors, each with `serve`'s user+system CPU seconds; throughput at
0 ms (64 in flight); the 100-agent fan-out + synthesis at 500 ms over its floor (3 runs); `POST
/swarms` p50 from one client with the engine in the process. Each build gets its own `serve`
and throwaway database per round; builds alternate, so drift hits both alike. Medians printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.bench_create import post_load
from bench.bench_engine_cpu import cpu_s
from bench.builds import add_builds
from bench.builds import builds as bench_builds
from bench.service import BENCH_TENANTS, QUOTAS, serve_db, tenants_file
from bench.table_rows import TERMINAL, run_swarm, swarm_body
from tests.support import free_port, process

Results = dict[str, list[float]]


async def rows(api: str, pid: int, out: Results) -> None:
    async with httpx.AsyncClient(base_url=api, timeout=120) as c:
        await run_swarm(c, swarm_body(100, 0, "none", 100))  # warm
        before = cpu_s(pid)
        wall = await run_swarm(c, swarm_body(1000, 200, "none", 256))
        out.setdefault("1000-agent / floor", []).append(wall / (1000 / 256 * 0.2))
        out.setdefault("1000-agent serve CPU s", []).append(cpu_s(pid) - before)
        before, t0 = cpu_s(pid), time.perf_counter()
        await asyncio.gather(*(run_swarm(c, swarm_body(100, 200, "none", 100))
                               for _ in range(50)))
        out.setdefault("50 x 100 / floor", []).append(
            (time.perf_counter() - t0) / (5000 / 256 * 0.2))
        out.setdefault("50 x 100 serve CPU s", []).append(cpu_s(pid) - before)
        out.setdefault("throughput /s", []).append(
            1000 / await run_swarm(c, swarm_body(1000, 0, "none", 64)))
        for _ in range(3):
            out.setdefault("fan-out / floor", []).append(
                await run_swarm(c, swarm_body(100, 500, "synthesize", 100)))
    one = await post_load(api, 1, 200)
    out.setdefault("POST one client p50 ms", []).append(one["p50"] * 1000)


async def anatomy(api: str, db: str, pid: int) -> None:
    async with httpx.AsyncClient(base_url=api, timeout=120) as c:
        await run_swarm(c, swarm_body(100, 0, "none", 100))
        before = cpu_s(pid)
        wall = await run_swarm(c, swarm_body(1000, 200, "none", 256))
        print(f"wall {wall:.3f} s, serve CPU {cpu_s(pid) - before:.2f} s")
    conn = await asyncpg.connect(db.replace("+asyncpg", ""))
    try:
        swarm = await conn.fetchrow("SELECT id, created_at, started_at, finished_at FROM swarms "
                                    "ORDER BY created_at DESC LIMIT 1")
        subs = await conn.fetch("SELECT ready_at, started_at, finished_at, latency_ms FROM "
                                "subtasks WHERE swarm_id = $1 AND kind = 'worker'", swarm["id"])
        calls = await conn.fetch("SELECT latency_ms FROM gateway_calls WHERE swarm_id = $1",
                                 swarm["id"])
    finally:
        await conn.close()
    t0 = swarm["created_at"]

    def deciles(xs: list[float]) -> str:
        q = statistics.quantiles(xs, n=10)
        return f"p10 {q[0]:.3f} / p50 {q[4]:.3f} / p90 {q[8]:.3f}"

    def since(at: Any) -> float:
        return float((at - t0).total_seconds())

    print(f"created -> started {since(swarm['started_at']):.3f} s, -> finished "
          f"{since(swarm['finished_at']):.3f} s")
    print("ready -> started s:", deciles([(s["started_at"] - s["ready_at"]).total_seconds()
                                          for s in subs]))
    print("subtask latency ms:", deciles([s["latency_ms"] for s in subs]))
    print("gateway latency ms:", deciles([r["latency_ms"] for r in calls]))
    print(f"first start {min(since(s['started_at']) for s in subs):.3f} s, last start "
          f"{max(since(s['started_at']) for s in subs):.3f} s, last finish "
          f"{max(since(s['finished_at']) for s in subs):.3f} s")


async def fanout_anatomy(api: str, db: str, sim: str) -> None:
    """The fan-out row's timeline, in ms from the client's POST: the answer to the POST, the
    swarm's start, the workers' starts, when the simulator's handler got their calls (and how
    long after its start a worker's call took to get there; see
    docs/decisions/0007-request-bytes-leave-in-their-step.md), the workers' ends, their
    gateway latency, the synthesizer, the end as stored and as the client's `?wait=` saw it."""
    body = swarm_body(100, 500, "synthesize", 100)
    async with httpx.AsyncClient(base_url=api, timeout=120) as c:
        await run_swarm(c, swarm_body(100, 0, "none", 100))
        await run_swarm(c, body)
        conn = await asyncpg.connect(db.replace("+asyncpg", ""))
        try:
            for _ in range(5):
                t0 = dt.datetime.now(dt.UTC)
                p0 = time.perf_counter()
                swarm_id = (await c.post("/swarms", json=body)).json()["id"]
                posted = time.perf_counter() - p0
                while (await c.get(f"/swarms/{swarm_id}", params={"wait": 30})
                       ).json()["status"] not in TERMINAL:
                    pass
                seen = time.perf_counter() - p0
                sw = await conn.fetchrow("SELECT started_at, finished_at FROM swarms "
                                         "WHERE id = $1", swarm_id)
                subs = await conn.fetch("SELECT name, kind, ready_at, started_at, finished_at FROM "
                                        "subtasks WHERE swarm_id = $1", swarm_id)
                calls = await conn.fetch("SELECT c.latency_ms FROM gateway_calls c JOIN subtasks"
                                         " s ON s.swarm_id = c.swarm_id AND s.name = "
                                         "c.subtask_name WHERE c.swarm_id = $1 AND s.kind = "
                                         "'worker'", swarm_id)

                def ms(at: Any, t0: dt.datetime = t0) -> str:
                    return f"{(at - t0).total_seconds() * 1000:.0f}"

                workers = [s for s in subs if s["kind"] == "worker"]
                synth = next(s for s in subs if s["kind"] == "synthesizer")
                by_key = (await c.get(f"{sim}/_stats")).json()["by_key"]
                got = {s["name"]: by_key[f"{swarm_id}:{s['name']}:1"]["received_at"]
                       for s in workers}
                lags = sorted(got[s["name"]] - s["started_at"].timestamp() for s in workers)
                reached = sorted(got.values())
                print(f"POST answered {posted * 1000:.0f} | swarm started {ms(sw['started_at'])} "
                      f"| workers started {ms(min(s['started_at'] for s in workers))}.."
                      f"{ms(max(s['started_at'] for s in workers))}, reached the gateway "
                      f"{(reached[0] - t0.timestamp()) * 1000:.0f}.."
                      f"{(reached[-1] - t0.timestamp()) * 1000:.0f} (p50 "
                      f"{lags[len(lags) // 2] * 1000:.1f} ms after their start), finished "
                      f"{ms(min(s['finished_at'] for s in workers))}.."
                      f"{ms(max(s['finished_at'] for s in workers))}, gateway p50 "
                      f"{statistics.median(r['latency_ms'] for r in calls):.0f} | synthesizer "
                      f"ready {ms(synth['ready_at'])} started {ms(synth['started_at'])} "
                      f"finished {ms(synth['finished_at'])} | swarm finished "
                      f"{ms(sw['finished_at'])} | seen {seen * 1000:.0f}")
        finally:
            await conn.close()


@contextlib.contextmanager
def serving(cli: str, work: Path, tenants: str = BENCH_TENANTS,
            database: dict[str, str] | None = None) -> Iterator[tuple[str, str, int, str]]:
    """A simulator at 0 ms and a build's `serve` on a throwaway database (or on `database`,
    `serve_db`'s environment of one kept by the caller): (api, db, pid, the simulator's base
    URL)."""
    sim_port, api_port = free_port(), free_port()
    sim, api = f"http://127.0.0.1:{sim_port}/v1", f"http://127.0.0.1:{api_port}"
    with (contextlib.nullcontext(database) if database is not None
          else serve_db("swarm_rows")) as db:
        env = {**db, "SWARM_GATEWAY_URL": sim, "SWARM_MAX_INFLIGHT": "256",
               "SWARM_MAX_RUNNING_SWARMS": "64",
               "SWARM_TENANTS_FILE": str(tenants_file(work, tenants))}
        with process(["simulator", "--port", str(sim_port)], {"SWARM_SIM_LATENCY_MS": "0"},
                     f"{sim}/models", work / "sim.log"), \
             process(["serve", "--port", str(api_port)], env, f"{api}/readyz",
                     work / "api.log", cli=cli) as serve:
            yield api, db["SWARM_DATABASE_URL"], serve.pid, sim



def one_round(cli: str, work: Path, out: Results | None, look: str = "wide",
              tenants: str = BENCH_TENANTS) -> None:
    with serving(cli, work, tenants) as (api, db, pid, sim):
        if out is not None:
            asyncio.run(rows(api, pid, out))
        elif look == "fanout":
            asyncio.run(fanout_anatomy(api, db, sim))
        else:
            asyncio.run(anatomy(api, db, pid))


def main() -> None:
    ap = argparse.ArgumentParser()
    add_builds(ap, "a build of swarm-api to measure (repeatable)", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--anatomy", nargs="?", const="wide", choices=("wide", "fanout"),
                    help="a timeline: one 1,000-agent swarm's (wide), or the fan-out row's")
    ap.add_argument("--quotas", default="lifted",
                    help="comma-separated: lifted (BENCH_TENANTS), checked (CHECKED_TENANTS)")
    args = ap.parse_args()
    quotas = args.quotas.split(",")
    if unknown := set(quotas) - QUOTAS.keys():
        ap.error(f"--quotas: unknown {sorted(unknown)}")
    builds = {(f"{n}/{q}" if len(quotas) > 1 else n, q): p
              for n, p in bench_builds(args).items() for q in quotas}
    if args.anatomy:
        for (name, quota), cli in builds.items():
            print(f"{name}:")
            one_round(cli, Path(tempfile.mkdtemp()), None, args.anatomy, QUOTAS[quota])
        return
    results: dict[str, Results] = {n: {} for n, _ in builds}
    for _ in range(args.rounds):
        for (name, quota), cli in builds.items():
            one_round(cli, Path(tempfile.mkdtemp()), results[name], tenants=QUOTAS[quota])
    for name, res in results.items():
        print(f"{name}: " + "; ".join(f"{k} {statistics.median(v):.3f}"
                                      for k, v in res.items()))


if __name__ == "__main__":
    main()
