"""The task is stored once (SPEC §3): a 1,000-agent swarm on a 0.2 MB task takes about one
more copy of the task than the same swarm on a 20-byte task, not a thousand (PostgreSQL)."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import InvalidRequestError

from app.db import queries
from tests.conftest import Harness, make_settings, start_harness
from tests.procs import Db

# the tables' sizes are measured as the batched writes leave them: without the latency devices
# each start is its own UPDATE, and the dead row versions they leave are counted as bytes
pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240), pytest.mark.latency_devices]

AGENTS = 1000
# every answer the same size whatever the task, so that only the task differs
SAME = "[[sim completion_tokens=8 latency_ms=0]]"


def body(task: str) -> dict[str, Any]:
    return {"task": task, "max_tokens": 16, "synthesis": {"strategy": "concatenate"},
            "agents": [{"name": f"a{i}", "system_prompt": SAME} for i in range(AGENTS)],
            # 0.2 MB prompts reserve ~0.12 USD a call: above the tenants' default budget of 10
            "limits": {"concurrency": AGENTS, "budget_usd": 100}}


async def stored_bytes(url: str) -> tuple[dict[str, int], int]:
    """(live bytes of each table with its indexes and TOAST, after VACUUM FULL; the raw
    pg_database_size before it)."""
    db = Db(url)
    raw = (await db.fetch("SELECT pg_database_size(current_database())"))[0][0]
    await quiet(db)
    await db.fetch("VACUUM FULL")
    live = await db.fetch("SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                          "JOIN pg_namespace n ON n.oid = c.relnamespace "
                          "WHERE n.nspname = 'public' AND c.relkind = 'r'")
    return {name: int(size) for name, size in live}, int(raw)


async def quiet(db: Db, timeout: float = 60.0) -> None:
    """Wait until no other session of this database holds a snapshot or a transaction: VACUUM
    FULL keeps every row version such a session might still see, and a loaded machine's service
    (a read in flight, a background sweep) once kept ~400 KB of the swarm's old subtask rows."""
    deadline = time.monotonic() + timeout
    while True:
        busy = await db.fetch(
            "SELECT pid, state, query FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)")
        if not busy:
            return
        assert time.monotonic() < deadline, f"sessions holding snapshots: {busy}"
        await asyncio.sleep(0.05)


async def grows(h: Harness, url: str, task: str) -> tuple[dict[str, int], int]:
    """How much each table grew (live bytes) and the database (raw) with one swarm on `task`."""
    before = await stored_bytes(url)
    data = await h.run(body(task), timeout=180)
    assert data["status"] == "succeeded", data["error"]
    after = await stored_bytes(url)
    return {name: size - before[0].get(name, 0) for name, size in after[0].items()}, \
        after[1] - before[1]


async def test_a_long_task_is_stored_once(db_url: str) -> None:
    # a lease long enough for a loaded machine: 1,000 calls of 0.2 MB bodies built and parsed
    # in this one process held its loop past the suite's 5 s lease under xdist, and the rescue
    # (unknown rows, re-sent attempts, their events) was what grew the database, not the task
    h, close = await start_harness(make_settings(db_url, lease_seconds=30.0))
    try:
        short = "review the migration"  # 20 bytes
        # 0.2 MB that no compression shrinks: the bound must hold for the bytes themselves
        long = base64.b64encode(os.urandom(150_000)).decode()
        assert (len(short), len(long)) == (20, 200_000)
        # a first swarm allocates every table's and index's first pages: not measured
        warm = await h.run({**body(short), "agents": body(short)["agents"][:2]})
        assert warm["status"] == "succeeded"
        short_tables, short_raw = await grows(h, db_url, short)
        long_tables, long_raw = await grows(h, db_url, long)
        short_live, long_live = sum(short_tables.values()), sum(long_tables.values())
        print(f"\nstorage of a {AGENTS}-agent swarm: 20-byte task +{short_live} B live "
              f"(+{short_raw} B raw), 0.2 MB task +{long_live} B live (+{long_raw} B raw)")
        outcomes = await Db(db_url).fetch(
            "SELECT outcome, count(*) FROM gateway_calls GROUP BY outcome")
        # which table took the difference, when one did
        more = {name: long_tables[name] - short_tables.get(name, 0) for name in long_tables
                if long_tables[name] != short_tables.get(name, 0)}
        assert long_live - short_live <= 2 * len(long), (more, outcomes)  # one per call?
        # reads that show no prompt do not load one
        async with h.app.state.sessions() as s:
            swarm_id = (await s.execute(text("SELECT id FROM swarms LIMIT 1"))).scalar_one()
            subs = (await queries.get_subtasks(s, [swarm_id]))[swarm_id]
            with pytest.raises(InvalidRequestError):
                _ = subs[0].prompt
    finally:
        await close()
