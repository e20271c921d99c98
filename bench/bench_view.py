"""Answers about wide swarms, A/B between builds: `GET /swarms/{id}` of a finished 1,000-agent
swarm (~1.2 MB), and the transactions `serve` commits while 50 swarms of 100 agents run, each
watched by a `?wait=` reader (PostgreSQL's own count for the database, pg_stat_database).

    .venv/bin/python -m bench.bench_view --cli before=/path/cli --cli after=/path/cli
        [--rounds 3] [--gets 20]

Each build gets its own `serve` and throwaway database per round; builds alternate, so drift
hits both alike. Medians printed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx

from bench.bench_rows import serving
from bench.builds import add_builds
from bench.builds import builds as bench_builds
from bench.table_rows import run_swarm, swarm_body

Results = dict[str, list[float]]


async def transactions(db: str) -> int:
    conn = await asyncpg.connect(db.replace("+asyncpg", ""))
    try:
        await asyncio.sleep(1.5)  # backends flush their counters at least every second
        return int(await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))
    finally:
        await conn.close()


async def measure(api: str, db: str, gets: int, out: Results) -> None:
    async with httpx.AsyncClient(base_url=api, timeout=120) as c:
        await run_swarm(c, swarm_body(1000, 0, "none", 256))
        swarm_id = (await c.get("/swarms", params={"limit": 1})).json()["items"][0]["id"]
        for path, key in ((f"/swarms/{swarm_id}", "GET 1,000-agent swarm ms"),
                          ("/swarms?limit=1", "GET list page of it ms")):
            times = []
            for _ in range(gets):
                t0 = time.perf_counter()
                (await c.get(path)).raise_for_status()
                times.append(time.perf_counter() - t0)
            out.setdefault(key, []).append(statistics.median(times) * 1000)
        before = await transactions(db)
        await asyncio.gather(*(run_swarm(c, swarm_body(100, 200, "none", 100))
                               for _ in range(50)))
        out.setdefault("transactions for 50 x 100", []).append(
            await transactions(db) - before)


def one_round(cli: str, gets: int, out: Results) -> None:
    with serving(cli, Path(tempfile.mkdtemp())) as (api, db, _, _sim):
        asyncio.run(measure(api, db, gets, out))


def main() -> None:
    ap = argparse.ArgumentParser()
    add_builds(ap, "a build of swarm-api to measure (repeatable)", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gets", type=int, default=20)
    args = ap.parse_args()
    builds = bench_builds(args)
    results: dict[str, Results] = {n: {} for n in builds}
    for _ in range(args.rounds):
        for name, cli in builds.items():
            one_round(cli, args.gets, results[name])
    for name, res in results.items():
        print(f"{name}: " + "; ".join(f"{k} {statistics.median(v):.1f}"
                                      for k, v in res.items()))


if __name__ == "__main__":
    main()
