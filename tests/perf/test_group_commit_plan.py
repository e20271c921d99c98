"""The group commit's statement finds each row it writes with one index probe, whether the
tables are new (no statistics yet) or hold history (analyzed), and in the plan a prepared
statement keeps, made once on a new database's tables and used while they grow: PostgreSQL's
plan, read with EXPLAIN on the real statement and its real arguments (on a new database the
subtasks' update once read half a swarm's rows per row, and against 20,000 swarms every commit
scanned the swarms table; docs/decisions/0009-plans-postgresql-keeps.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import asyncpg
import pydantic_core
import pytest

from app.db.changes import SwarmWrite
from app.db.commit_statement import statement
from app.db.driver import DirectConnection
from app.db.session import asyncpg_dsn
from tests.conftest import SKIP_PG
from tests.support import kept_plan, plan_nodes

OWNER = "plan-owner"
WIDE = "wide-swarm"
AGENTS = 1000


def _writes() -> list[SwarmWrite]:
    """50 subtasks of a 1,000-agent swarm succeeding: their states, settled ledger rows and
    events, as the engine writes them."""
    now = datetime.now(UTC)
    swarm = {"status": "running", "spent_usd": Decimal("0.5"), "reserved_usd": Decimal(0),
             "unresolved_usd": Decimal(0), "prompt_tokens": 500, "completion_tokens": 250,
             "gateway_calls": 50, "result": None, "error": None, "started_at": now,
             "finished_at": None, "event_seq": 100}
    writes = []
    for i in range(500, 550):
        name = f"agent-{i}"
        state = {"status": "succeeded", "attempts": 1, "output": "done", "error": None,
                 "truncated": False, "sanitized": False, "prompt_tokens": 10,
                 "completion_tokens": 5, "cost_usd": Decimal("0.01"), "latency_ms": 3.0,
                 "ready_at": now, "started_at": now, "finished_at": now, "turns": 0,
                 "tool_calls": 0}
        ledger = {"swarm_id": WIDE, "tenant": "default", "subtask_name": name,
                  "model": "kimi-k2.5", "idempotency_key": f"{WIDE}:{name}:1", "attempt": 1,
                  "http_status": 200, "outcome": "ok", "prompt_tokens": 10,
                  "completion_tokens": 5, "cached_tokens": 0, "cost_usd": Decimal("0.01"),
                  "reserved_usd": Decimal("0.02"), "latency_ms": 3.0, "created_at": now}
        event = {"swarm_id": WIDE, "seq": i, "type": "subtask.succeeded",
                 "data": {"subtask": name}, "created_at": now}
        writes.append(SwarmWrite(WIDE, 1, swarm, [{"name_": name, "position_": i, **state}],
                                 [ledger], [event]))
    return writes


async def _fill(conn: asyncpg.Connection) -> None:
    """20,000 finished swarms of one subtask each, and one running 1,000-agent swarm leased to
    OWNER."""
    await conn.execute("""
        INSERT INTO swarms (id, tenant, status, task, spec, metadata, spent_usd, reserved_usd,
                            unresolved_usd, prompt_tokens, completion_tokens, gateway_calls,
                            created_at, lease_epoch, event_seq, rescues, cancel_requested,
                            lease_owner)
        SELECT CASE WHEN i = 0 THEN $1 ELSE 'old-' || i END, 'default',
               CASE WHEN i = 0 THEN 'running' ELSE 'succeeded' END, 't', '{}', '{}', 0, 0, 0,
               0, 0, 0, now(), 1, 0, 0, false, CASE WHEN i = 0 THEN $2 END
        FROM generate_series(0, 20000) AS i""", WIDE, OWNER)
    await conn.execute("""
        INSERT INTO subtasks (swarm_id, name, position, kind, model, depends_on, max_tokens,
                              weight, status, attempts, truncated, prompt_tokens,
                              completion_tokens, cost_usd)
        SELECT CASE WHEN i < $2 THEN $1 ELSE 'old-' || (i - $2 + 1) END,
               'agent-' || CASE WHEN i < $2 THEN i ELSE 0 END,
               CASE WHEN i < $2 THEN i ELSE 0 END, 'worker', 'kimi-k2.5', '[]', 100, 1,
               CASE WHEN i < $2 THEN 'running' ELSE 'succeeded' END, 1, false, 0, 0, 0
        FROM generate_series(0, $2 + 19999) AS i""", WIDE, AGENTS)
    for i in range(500, 550):  # written ahead: the batch settles them
        await conn.execute("""
            INSERT INTO gateway_calls (swarm_id, tenant, subtask_name, model, idempotency_key,
                                       attempt, outcome, prompt_tokens, completion_tokens,
                                       cached_tokens, cost_usd, reserved_usd, latency_ms,
                                       created_at)
            VALUES ($1, 'default', $2, 'kimi-k2.5', $3, 1, 'in_flight', 0, 0, 0, 0, 0.02, 0,
                    now())""", WIDE, f"agent-{i}", f"{WIDE}:agent-{i}:1")


async def _plan(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    stmt = statement(OWNER, _writes())
    raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {stmt.sql}", *stmt.args)
    plan = pydantic_core.from_json(raw)[0]["Plan"]
    return list(plan_nodes(plan))


async def _generic_plan(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    stmt = statement(OWNER, _writes())
    return await kept_plan(conn, stmt.sql, stmt.args)


def _probes_only(nodes: list[dict[str, Any]], stats: str) -> None:
    scans = [n for n in nodes if n.get("Relation Name") in ("swarms", "subtasks")
             and n["Node Type"] != "ModifyTable"]
    assert {n["Relation Name"] for n in scans} == {"swarms", "subtasks"}, stats
    for n in scans:
        # never the whole table, never every row of a swarm filtered by name, never an index
        # read whole for a column it does not lead with
        assert n["Node Type"] in ("Index Scan", "Index Only Scan"), (stats, n)
        cond = n.get("Index Cond", "")
        if n["Relation Name"] == "subtasks":
            assert "name" in cond or "position" in cond, (stats, n["Index Name"], cond)
        else:
            assert n["Index Name"] == "pk_swarms" and "id" in cond, (stats, n["Index Name"])


@pytest.mark.skipif(SKIP_PG, reason="the group commit's one statement is PostgreSQL's")
async def test_the_group_commit_probes_one_row_per_row_written(db_url: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        await _fill(conn)
        for stats in ("none yet", "analyzed"):
            if stats == "analyzed":
                await conn.execute("ANALYZE")
            _probes_only(await _plan(conn), stats)
            _probes_only(await _generic_plan(conn), f"{stats}, kept")
        # and the statement does what it plans: 50 subtasks settled, their ledger rows too
        stmt = statement(OWNER, _writes())
        assert {r[0] for r in await conn.fetch(stmt.sql, *stmt.args)} == {WIDE}
        assert await conn.fetchval(
            "SELECT count(*) FROM subtasks WHERE swarm_id = $1 AND status = 'succeeded'",
            WIDE) == 50
        assert await conn.fetchval(
            "SELECT count(*) FROM gateway_calls WHERE outcome = 'ok'") == 50
    finally:
        await conn.close()


@pytest.mark.skipif(SKIP_PG, reason="the group commit's one statement is PostgreSQL's")
async def test_the_plan_kept_from_a_new_database_probes_as_the_tables_grow(db_url: str) -> None:
    """Prepared on a new database (two swarms, no statistics), the statement's kept plan is
    the one every later commit runs: it must find rows by key, not scan what is there."""
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        await conn.execute("""
            INSERT INTO swarms (id, tenant, status, task, spec, metadata, spent_usd,
                                reserved_usd, unresolved_usd, prompt_tokens,
                                completion_tokens, gateway_calls, created_at, lease_epoch,
                                event_seq, rescues, cancel_requested, lease_owner)
            SELECT s, 'default', 'running', 't', '{}', '{}', 0, 0, 0, 0, 0, 0, now(), 1, 0, 0,
                   false, $2
            FROM unnest(ARRAY[$1, 'other']) AS s""", WIDE, OWNER)
        await conn.execute("""
            INSERT INTO subtasks (swarm_id, name, position, kind, model, depends_on,
                                  max_tokens, weight, status, attempts, truncated,
                                  prompt_tokens, completion_tokens, cost_usd)
            SELECT $1, 'agent-' || i, i, 'worker', 'kimi-k2.5', '[]', 100, 1, 'running', 1,
                   false, 0, 0, 0
            FROM generate_series(500, 549) AS i""", WIDE)
        _probes_only(await _generic_plan(conn), "new database, kept")
    finally:
        await conn.close()


@pytest.mark.skipif(SKIP_PG, reason="the group commit's one statement is PostgreSQL's")
async def test_the_group_commits_connection_plans_each_statement_once(db_url: str) -> None:
    """On the writer's own connection a statement is planned once and that plan kept, from
    its first run: never planned anew per commit (~0.55 ms of the server's CPU each, where the
    generic plan's estimate came out above the custom ones')."""
    direct = DirectConnection(db_url)
    try:
        stmt = statement(OWNER, _writes())
        for _ in range(8):
            await direct.fetch(stmt.sql, stmt.args)
        rows = await direct.fetch("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                                  "WHERE statement = $1", [stmt.sql])
        assert [tuple(r) for r in rows] == [(8, 0)]
    finally:
        await direct.close()
