"""`POST /swarms/estimate` of a 1,000-agent swarm against a tenant with 100,000 ledger rows of
history, on PostgreSQL: the answer's p50 over HTTP (a real `swarm-api serve` of each build
given, in turn, on one seeded database a round), and the plan
PostgreSQL takes for the history statement (an index scan that stops at the window, never a
scan of the ledger).

    .venv/bin/python -m bench.bench_estimate [--rows 100000] [--requests 40] [--rounds 3]
        [--cli before=path/to/swarm-api --cli after=.venv/bin/swarm-api]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy import insert, inspect
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.history import HISTORY, window
from app.db.tables import Subtask, Swarm
from app.db.types import utcnow
from app.engine.specs import new_swarm_row
from app.engine.subtask_rows import new_subtask
from app.states import SubtaskKind, SubtaskStatus, SwarmStatus
from bench.bench_rows import serving
from bench.builds import add_builds
from bench.builds import builds as bench_builds
from bench.cpu import cpu_s
from bench.service import serve_db

TENANT = "default"  # the tenant of a service without SWARM_API_KEYS
PER_SWARM = 1000


def row_of(obj: Any, table: type[Any]) -> dict[str, Any]:
    """A live row's columns by column name (Core inserts)."""
    return {a.columns[0].name: getattr(obj, a.key) for a in inspect(table).column_attrs
            if a.key != "id" or table is Swarm}  # a subtask's id is the database's


async def seed(db: str, rows: int) -> None:
    """`rows` succeeded subtasks of finished swarms (1,000 a swarm), one ledger row each,
    spread over the last 20 days."""
    engine = create_async_engine(db)
    now = utcnow()
    try:
        for k in range(rows // PER_SWARM):
            sid = str(uuid.uuid4())
            swarm = new_swarm_row(sid, TENANT, f"history {k}", {"limits": {}}, {}, None,
                                  None, None)
            swarm.status, swarm.finished_at = SwarmStatus.succeeded, now
            subs = [new_subtask(sid, f"a{i}", i, SubtaskKind.worker,
                                "kimi-k2.5" if i % 3 else "deepseek-v3.2", 600)
                    for i in range(PER_SWARM)]
            for s in subs:
                s.status = SubtaskStatus.succeeded
            async with engine.begin() as conn:
                await conn.execute(insert(Swarm.__table__), [row_of(swarm, Swarm)])
                await conn.execute(insert(Subtask.__table__), [row_of(s, Subtask) for s in subs])
        async with engine.begin() as conn:
            await conn.exec_driver_sql(
                "INSERT INTO gateway_calls (swarm_id, tenant, subtask_name, model, "
                "idempotency_key, attempt, http_status, outcome, prompt_tokens, "
                "completion_tokens, cached_tokens, cost_usd, reserved_usd, at_bound, "
                "latency_ms, created_at) "
                "SELECT s.swarm_id, $1, s.name, s.model, s.swarm_id || ':' || s.name || ':1', 1,"
                " 200, 'ok', 80 + s.position % 40, 20 + (s.position * 7919) % 381, 0, 0.0003,"
                " 0.002, false, 120.0, $2::timestamptz - random() * interval '20 days' "
                "FROM subtasks s", (TENANT, now))
            await conn.exec_driver_sql("ANALYZE gateway_calls")
            await conn.exec_driver_sql("ANALYZE subtasks")
    finally:
        await engine.dispose()


async def explain(db: str, runs: int = 20) -> tuple[str, float]:
    """The history statement's plan, and its p50 in ms (alone, over one connection)."""
    sql = str(HISTORY.params(window(TENANT)).compile(dialect=postgresql.dialect(),
                                                compile_kwargs={"literal_binds": True}))
    conn = await asyncpg.connect(db.replace("+asyncpg", ""))
    try:
        lines = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}")
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            await conn.fetch(sql)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        await conn.close()
    return "\n".join(r[0] for r in lines), statistics.median(times)


def body(agents: int) -> dict[str, Any]:
    return {"task": "Review every module of the payment service", "model": "kimi-k2.5",
            "max_tokens": 600, "limits": {"concurrency": 64},
            "agents": [{"name": f"a{i}", "system_prompt": f"You review module {i}."}
                       for i in range(agents)]}


async def measure(api: str, agents: int, requests: int, warm: int = 3
                  ) -> tuple[list[float], dict[str, Any]]:
    times: list[float] = []
    async with httpx.AsyncClient(base_url=api, timeout=60) as c:
        answer: dict[str, Any] = {}
        for i in range(requests + warm):
            t0 = time.perf_counter()
            r = await c.post("/swarms/estimate", json=body(agents))
            elapsed = time.perf_counter() - t0
            r.raise_for_status()
            answer = r.json()
            if i >= warm:  # warm-up: the first statements' plans, the app's first answers
                times.append(elapsed * 1000)
    return times, answer


def one_round(builds: dict[str, str], rows: int, agents: int, requests: int, plan: bool,
              cpus: dict[str, list[float]]) -> dict[str, list[float]]:
    """One database seeded once (migrated by the first build's `serve`), then each build's
    `serve` on it in turn: each build's estimate times."""
    got: dict[str, list[float]] = {}
    with serve_db("swarm_estimate") as database:
        for i, (name, cli) in enumerate(builds.items()):
            with serving(cli, Path(tempfile.mkdtemp()), database=database) as (api, db, pid, _):
                if i == 0:
                    t0 = time.perf_counter()
                    asyncio.run(seed(db, rows))
                    print(f"  seeded {rows} ledger rows in {time.perf_counter() - t0:.1f} s")
                asyncio.run(measure(api, agents, 0))
                # the serve's own CPU per estimate: what a loaded machine's queueing leaves out
                cpu0 = cpu_s(pid)
                times, answer = asyncio.run(measure(api, agents, requests, warm=0))
                cpu = (cpu_s(pid) - cpu0) / requests * 1000
                q = statistics.quantiles(times, n=10)
                print(f"  {name}: POST /swarms/estimate, {agents} agents, {rows} rows of "
                      f"history: p50 {statistics.median(times):.1f} ms, p90 {q[8]:.1f} ms, "
                      f"min {min(times):.1f} ms ({len(times)} requests), serve CPU "
                      f"{cpu:.1f} ms a request; basis {answer['basis']}")
                cpus.setdefault(name, []).append(cpu)
                got[name] = times
                if plan and i == 0:
                    shown, alone = asyncio.run(explain(db))
                    print(f"  the history statement alone: p50 {alone:.1f} ms")
                    print(shown)
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of every build, taken in turn (a shared machine's load "
                         "then weighs on each alike)")
    add_builds(ap, "a build of swarm-api to measure (repeatable; default this checkout's)")
    args = ap.parse_args()
    builds = bench_builds(args, ("this", str(Path(".venv/bin/swarm-api").resolve())))
    p50s: dict[str, list[float]] = {name: [] for name in builds}
    cpus: dict[str, list[float]] = {}
    for r in range(args.rounds):
        print(f"round {r + 1}:")
        # the builds in turn, the first one alternating: a shared machine's load weighs alike
        order = list(builds.items())[r % len(builds):] + list(builds.items())[:r % len(builds)]
        for name, times in one_round({n: str(Path(c).absolute()) for n, c in order},
                                     args.rows, args.agents, args.requests, r == 0,
                                     cpus).items():
            p50s[name].append(statistics.median(times))
    for name, got in p50s.items():
        print(f"{name}: median of {len(got)} rounds' p50 {statistics.median(got):.1f} ms "
              f"(each: {', '.join(f'{x:.1f}' for x in got)}); serve CPU a request, median "
              f"{statistics.median(cpus[name]):.1f} ms "
              f"(each: {', '.join(f'{x:.1f}' for x in cpus[name])})")


if __name__ == "__main__":
    main()
