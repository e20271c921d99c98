"""A swarm looked up by id for a tenant (every `GET /swarms/{id}`, `?wait=`, follow, cancel) is
found by its primary key in the plan PostgreSQL keeps for the statement, the one made on a new
database and run as the tenant's swarms accumulate (`id = $1 AND tenant = $2` kept a read of
the tenant's whole (tenant, status, created_at) index;
docs/decisions/0009-plans-postgresql-keeps.md); and a swarm of another tenant is still not
found."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from sqlalchemy import event

from app.db import queries
from app.db.session import asyncpg_dsn, make_db_engine, make_session_factory
from app.states import SwarmStatus
from tests.conftest import SKIP_PG
from tests.support import kept_plan


@pytest.mark.skipif(SKIP_PG, reason="the kept plan is PostgreSQL's")
async def test_a_tenants_swarm_is_found_by_its_key_and_anothers_is_not(db_url: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    engine = make_db_engine(db_url)
    sent: list[tuple[str, tuple[Any, ...]]] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _sent(_c: Any, _cur: Any, sql: str, params: Any, _ctx: Any, _many: bool) -> None:
        if "FROM swarms" in sql:
            sent.append((sql, tuple(params)))

    try:
        await conn.execute("""
            INSERT INTO swarms (id, tenant, status, task, spec, metadata, spent_usd,
                                reserved_usd, unresolved_usd, prompt_tokens,
                                completion_tokens, gateway_calls, created_at, lease_epoch,
                                event_seq, rescues, cancel_requested)
            SELECT id, tenant, 'succeeded', 't', '{}', '{}', 0, 0, 0, 0, 0, 0, now(), 0, 0, 0,
                   false
            FROM unnest(ARRAY['mine', 'mine-too', 'theirs'], ARRAY['a', 'a', 'b'])
                 AS s(id, tenant)""")
        async with make_session_factory(engine)() as s:
            assert await queries.get_status(s, "mine", "a") == SwarmStatus.succeeded
            assert await queries.get_status(s, "theirs", "a") is None
            assert await queries.get_status(s, "theirs", None) == SwarmStatus.succeeded
            assert await queries.get_status(s, "nobody", "a") is None
            mine = await queries.get_swarm(s, "mine", "a")
            assert mine is not None and mine.id == "mine"
            assert await queries.get_swarm(s, "theirs", "a") is None
            assert await queries.get_swarm(s, "theirs", "a", for_update=True) is None
            theirs = await queries.get_swarm(s, "theirs", None)
            assert theirs is not None and theirs.tenant == "b"
        assert sent
        for sql, params in sent:
            nodes = await kept_plan(conn, sql, [str(p) for p in params])
            scans = [n for n in nodes if n.get("Relation Name") == "swarms"]
            assert scans, sql
            for n in scans:
                assert n.get("Index Name") == "pk_swarms", (sql, n)
    finally:
        await engine.dispose()
        await conn.close()
