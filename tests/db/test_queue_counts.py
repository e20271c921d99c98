"""`tenant_queues` (migration 0013): the database's triggers keep each tenant's count of waiting
swarms (queued, claimed by no engine) through every way a row enters or leaves the queue — an
insert, a status move either way, a claim and its release, a tenant change, a delete, a
TRUNCATE (PostgreSQL) — and the migration counts the swarms already waiting. A new swarm's
`queue_position` is read from it (also checked in tests/api/test_tenant_isolation.py and
tests/perf/test_create_statement.py). SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Connection, text

from app.db.migrate import alembic_config, upgrade_head
from tests.conftest import make_settings, start_harness
from tests.count_support import insert_swarms, replay
from tests.helpers import agent, on_sync

BEFORE = "0012_ledger_at_bound"
def _counts(conn: Connection) -> tuple[dict[str, int], dict[str, int]]:
    """(the trigger-kept counts, a count of the rows) of waiting swarms, by tenant."""
    kept = conn.execute(text("SELECT tenant, sum(queued) FROM tenant_queues GROUP BY tenant "
                             "HAVING sum(queued) <> 0")).all()
    rows = conn.execute(text("SELECT tenant, count(*) FROM swarms WHERE status = 'queued' "
                             "AND lease_owner IS NULL GROUP BY tenant")).all()
    return {str(t): int(n) for t, n in kept}, {str(t): int(n) for t, n in rows}


def _agree(url: str) -> dict[str, int]:
    kept, counted = on_sync(url, _counts)
    assert kept == counted
    return kept


def test_the_counts_follow_every_move_in_and_out_of_the_queue(empty_url: str) -> None:
    url = empty_url
    command.upgrade(alembic_config(url), BEFORE)
    on_sync(url, lambda c: insert_swarms(c, ("a1", "acme", "queued"), ("a2", "acme", "queued"),
                               ("a3", "acme", "running"), ("g1", "globex", "queued"),
                               ("g2", "globex", "queued")))
    on_sync(url, lambda c: c.execute(text("UPDATE swarms SET lease_owner = 'w' WHERE id = 'g2'")))
    upgrade_head(url)  # the migration counts what waits already (not g2: claimed)
    assert _agree(url) == {"acme": 2, "globex": 1}

    on_sync(url, lambda c: insert_swarms(c, ("a4", "acme", "queued"), ("a5", "acme", "succeeded")))
    assert _agree(url) == {"acme": 3, "globex": 1}
    steps = [
        # claimed: starting, not waiting; released (a drain): waiting again; started
        ("UPDATE swarms SET lease_owner = 'w' WHERE id = 'a1'", {"acme": 2, "globex": 1}),
        ("UPDATE swarms SET lease_owner = NULL WHERE id = 'a1'", {"acme": 3, "globex": 1}),
        ("UPDATE swarms SET lease_owner = 'w', status = 'running' WHERE id = 'a1'",
         {"acme": 2, "globex": 1}),
        ("UPDATE swarms SET status = 'running' WHERE id = 'g2'", {"acme": 2, "globex": 1}),
        # a status written again unchanged (every group commit does) moves nothing
        ("UPDATE swarms SET status = 'queued', event_seq = 1 WHERE id = 'a2'",
         {"acme": 2, "globex": 1}),
        ("UPDATE swarms SET status = 'queued' WHERE id = 'a3'", {"acme": 3, "globex": 1}),
        ("UPDATE swarms SET status = 'cancelled' WHERE id IN ('a2', 'g1')", {"acme": 2}),
        ("UPDATE swarms SET tenant = 'globex' WHERE id = 'a4'", {"acme": 1, "globex": 1}),
        ("DELETE FROM swarms WHERE id IN ('a3', 'a5')", {"globex": 1}),
    ]
    replay(url, steps, _agree, BEFORE)


@pytest.mark.parametrize("quotas", [True, False], ids=["in_a_transaction", "one_statement"])
async def test_a_new_swarms_position_counts_what_is_still_queued(database_url: str,
                                                                 tmp_path: Path,
                                                                 quotas: bool) -> None:
    """Cancelled swarms leave the count; another tenant's never enter it. With SPEC §8's
    quotas the creation is a transaction; without, one statement (PostgreSQL)."""
    limits = None
    if not quotas:
        limits = tmp_path / "tenants.toml"
        limits.write_text("[defaults]\n")
    h, close = await start_harness(make_settings(
        database_url, api_keys="acme:ka,globex:kb",
        **({} if limits is None else {"tenants_file": str(limits)})), run_engine=False)
    a, b = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    try:
        ids = []
        for i in range(3):
            r = await h.post({"task": f"a{i}", "agents": [agent("x")]}, headers=a)
            assert r.json()["queue_position"] == i + 1
            ids.append(r.json()["id"])
        assert (await h.post({"task": "b", "agents": [agent("x")]}, headers=b)
                ).json()["queue_position"] == 1
        for sid in ids[:2]:
            assert (await h.client.post(f"/swarms/{sid}/cancel", headers=a)).status_code == 202
        r = await h.post({"task": "a3", "agents": [agent("x")]}, headers=a)
        assert r.json()["queue_position"] == 2
        # a read ranks the swarm among its tenant's queue (by creation)
        assert (await h.client.get(f"/swarms/{ids[2]}", headers=a)).json()["queue_position"] == 1
    finally:
        await close()


async def test_the_counts_hold_under_concurrent_creations_and_cancels(database_url: str) -> None:
    h, close = await start_harness(make_settings(database_url, api_keys="acme:ka,globex:kb"),
                                   run_engine=False)
    keys = [{"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}]
    try:
        created = await asyncio.gather(*(
            h.post({"task": f"t{i}", "agents": [agent("x")]}, headers=keys[i % 2])
            for i in range(40)))
        assert all(r.status_code == 202 for r in created)
        cancels = await asyncio.gather(*(
            h.client.post(f"/swarms/{r.json()['id']}/cancel", headers=keys[i % 2])
            for i, r in enumerate(created) if i % 4 < 2))
        assert all(r.status_code == 202 for r in cancels)
        assert await asyncio.to_thread(_agree, database_url) == {"acme": 10, "globex": 10}
        r = await h.post({"task": "last", "agents": [agent("x")]}, headers=keys[0])
        assert r.json()["queue_position"] == 11
    finally:
        await close()
