"""What a retry costs: `POST /swarms/{id}/retry` of a failed 1,000-subtask swarm (900 outputs of
2 KB kept, 100 to run again) against `POST /swarms` of the same 1,000 agents, and the copy
itself (one INSERT … SELECT) against copying the same rows through Python (Core select, then
executemany insert). In-process app without an engine (nothing runs), SQLite and PostgreSQL.
Prints its figures (bench/RESULTS.md's "Other workloads" row is updated from them).

    .venv/bin/python -m bench.bench_retry [--agents 1000] [--runs 7]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httpx
from sqlalchemy import Table, insert, select, update

from app.config import Settings
from app.db.columns import SUBTASK_INSERT_COLUMNS
from app.db.migrate import upgrade_head
from app.db.retry_copy import copy_swarm
from app.db.tables import Subtask, Swarm
from app.engine.specs import new_swarm_row
from app.main import create_app
from tests.support import throwaway_db

OUTPUT = ("the analysis shows that the migration is consistent with the plan. " * 30)[:2048]


async def median_ms(runs: int, step: Callable[[], Awaitable[Any]]) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await step()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


async def fail_it(sessions: Any, swarm_id: str, agents: int) -> None:
    """Make the swarm a failed one: 90 % of its workers succeeded with a 2 KB output."""
    t = cast(Table, Subtask.__table__)
    kept = int(agents * 0.9)
    async with sessions() as s, s.begin():
        await s.execute(update(t).where(t.c.swarm_id == swarm_id, t.c.position < kept)
                        .values(status="succeeded", output=OUTPUT, attempts=1))
        await s.execute(update(t).where(t.c.swarm_id == swarm_id, t.c.position >= kept)
                        .values(status="failed"))
        await s.execute(update(Swarm).where(Swarm.id == swarm_id).values(status="failed"))


async def python_copy(sessions: Any, old: Swarm) -> None:
    """The copy without INSERT … SELECT: every row (outputs included) through Python."""
    t = cast(Table, Subtask.__table__)
    async with sessions() as s, s.begin():
        new = new_swarm_row(str(uuid.uuid4()), old.tenant, old.task, old.spec, old.meta,
                            old.budget_usd, None, None, retry_of=old.id)
        s.add(new)
        await s.flush()
        rows = (await s.execute(select(*(t.c[c] for c in SUBTASK_INSERT_COLUMNS))
                                .where(t.c.swarm_id == old.id))).mappings().all()
        copied = []
        for r in rows:
            row = dict(r)
            ok = row["status"] == "succeeded" and row["kind"] != "synthesizer"
            row.update(swarm_id=new.id, reused=ok, status="succeeded" if ok else "pending",
                       output=row["output"] if ok else None, attempts=0)
            copied.append(row)
        await s.execute(insert(t), copied)


async def sql_copy(sessions: Any, old: Swarm) -> None:
    async with sessions() as s, s.begin():
        new = new_swarm_row(str(uuid.uuid4()), old.tenant, old.task, old.spec, old.meta,
                            old.budget_usd, None, None, retry_of=old.id)
        await copy_swarm(s, old.id, new)


async def measure(url: str, agents: int, runs: int) -> dict[str, float]:
    settings = Settings(_env_file=None, database_url=url, max_agents=max(agents, 1000))
    app = create_app(settings, run_engine=False)
    body = {"task": "Review the migration", "agents": [
        {"name": f"agent_{i}", "system_prompt": "You review one part of the migration."}
        for i in range(agents)]}
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api", timeout=60) as c:
        sessions = app.state.sessions
        old_id = (await c.post("/swarms", json=body)).raise_for_status().json()["id"]
        await fail_it(sessions, old_id, agents)
        async with sessions() as s:
            old = (await s.execute(select(Swarm).where(Swarm.id == old_id))).scalar_one()

        async def create() -> None:
            (await c.post("/swarms", json=body)).raise_for_status()

        async def retry() -> None:
            (await c.post(f"/swarms/{old_id}/retry")).raise_for_status()

        await create()  # warm-up
        await retry()
        return {
            "create": await median_ms(runs, create),
            "retry": await median_ms(runs, retry),
            "sql_copy": await median_ms(runs, lambda: sql_copy(sessions, old)),
            "python_copy": await median_ms(runs, lambda: python_copy(sessions, old)),
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as work:
        sqlite = f"sqlite+aiosqlite:///{work}/bench.db"
        upgrade_head(sqlite)
        results["SQLite"] = asyncio.run(measure(sqlite, args.agents, args.runs))
    with throwaway_db("bench_retry") as pg:
        results["PostgreSQL"] = asyncio.run(measure(pg, args.agents, args.runs))
    lines = [
        "", "## Retry: the cost of copying a failed swarm (in-process, no engine)", "",
        f"A failed swarm of {args.agents} worker subtasks (+ synthesizer), 90 % succeeded with "
        "2 KB outputs. Medians of "
        f"{args.runs} runs. *retry* = `POST /swarms/{{id}}/retry` (new swarm, INSERT … SELECT "
        "of the subtasks, first events, the answer); *create* = `POST /swarms` of the same "
        "agents; *SQL copy* = the repository function alone; *Python copy* = the same rows "
        "selected into Python and inserted with one executemany.", "",
        "| database | create ms | retry ms | retry / create | SQL copy ms | Python copy ms "
        "| Python / SQL copy |", "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for db, r in results.items():
        lines.append(f"| {db} | {r['create']:.1f} | {r['retry']:.1f} | "
                     f"{r['retry'] / r['create']:.2f} | {r['sql_copy']:.1f} | "
                     f"{r['python_copy']:.1f} | {r['python_copy'] / r['sql_copy']:.2f} |")
    lines += ["", f"- command: `.venv/bin/python -m bench.bench_retry --agents {args.agents} "
              f"--runs {args.runs}`",
              f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; Python "
              f"{platform.python_version()}"]
    text = "\n".join(lines) + "\n"
    print(text)


if __name__ == "__main__":
    main()
