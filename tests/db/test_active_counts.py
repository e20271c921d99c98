"""`tenant_active` (migration 0024): the database's triggers keep each tenant's count of the swarms
`max_active_swarms` counts (queued, awaiting approval, planning, running, synthesizing) through
every way a row enters or leaves those states — an insert, a status move either way, a tenant
change, a delete, a TRUNCATE (PostgreSQL) — and the migration counts the swarms already there;
`tenant_admit` (PostgreSQL) and the session paths' count read it. SQLite and PostgreSQL."""

from __future__ import annotations

import importlib.util

import pytest
from alembic import command
from sqlalchemy import Connection, text

from app.db.migrate import MIGRATIONS_DIR, alembic_config, upgrade_head
from app.states import COUNTED_SWARM
from tests.count_support import insert_swarms, replay
from tests.helpers import on_sync

BEFORE = "0020_swarm_approval"
COUNTED = ("queued", "awaiting_approval", "planning", "running", "synthesizing")


def _counts(conn: Connection) -> tuple[dict[str, int], dict[str, int]]:
    """(the trigger-kept counts, a count of the rows) of counted swarms, by tenant."""
    kept = conn.execute(text("SELECT tenant, sum(active) FROM tenant_active GROUP BY tenant "
                             "HAVING sum(active) <> 0")).all()
    statuses = ", ".join(f"'{s}'" for s in COUNTED)
    rows = conn.execute(text(f"SELECT tenant, count(*) FROM swarms WHERE status IN ({statuses}) "
                             "GROUP BY tenant")).all()
    return {str(t): int(n) for t, n in kept}, {str(t): int(n) for t, n in rows}


def _agree(url: str) -> dict[str, int]:
    kept, counted = on_sync(url, _counts)
    assert kept == counted
    return kept


def test_the_migration_counts_what_the_quota_counts() -> None:
    path = MIGRATIONS_DIR / "versions" / "20261206_0024_tenant_active.py"
    spec = importlib.util.spec_from_file_location("tenant_active_0024", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.COUNTED) == {s.value for s in COUNTED_SWARM} == set(COUNTED)


def test_the_counts_follow_every_move_in_and_out(empty_url: str) -> None:
    url = empty_url
    command.upgrade(alembic_config(url), BEFORE)
    on_sync(url, lambda c: insert_swarms(c, ("a1", "acme", "queued"), ("a2", "acme", "running"),
                               ("a3", "acme", "succeeded"), ("g1", "globex", "awaiting_approval"),
                               ("g2", "globex", "cancelled")))
    upgrade_head(url)  # the migration counts what is active already
    assert _agree(url) == {"acme": 2, "globex": 1}

    on_sync(url, lambda c: insert_swarms(c, ("a4", "acme", "queued"), ("a5", "acme", "failed")))
    assert _agree(url) == {"acme": 3, "globex": 1}
    steps = [
        # a claim, a start and a status written again unchanged move nothing
        ("UPDATE swarms SET lease_owner = 'w' WHERE id = 'a1'", {"acme": 3, "globex": 1}),
        ("UPDATE swarms SET status = 'planning' WHERE id = 'a1'", {"acme": 3, "globex": 1}),
        ("UPDATE swarms SET status = 'running', event_seq = 1 WHERE id IN ('a1', 'a2')",
         {"acme": 3, "globex": 1}),
        # ends (one statement ending several of two tenants), a decision, a retry's copy
        ("UPDATE swarms SET status = 'succeeded' WHERE id IN ('a1', 'g1')", {"acme": 2}),
        ("UPDATE swarms SET status = 'queued' WHERE id = 'g2'", {"acme": 2, "globex": 1}),
        ("UPDATE swarms SET tenant = 'globex' WHERE id = 'a4'", {"acme": 1, "globex": 2}),
        ("UPDATE swarms SET status = 'failed' WHERE status <> 'succeeded'", {}),
        ("UPDATE swarms SET status = 'running' WHERE id IN ('a2', 'a3')", {"acme": 2}),
        ("DELETE FROM swarms WHERE id IN ('a3', 'a5')", {"acme": 1}),
    ]
    replay(url, steps, _agree, BEFORE)


def test_tenant_admit_reads_the_kept_counts_and_its_old_count_comes_back(
        empty_url: str) -> None:
    """PostgreSQL: the creation's check (migration 0014's function, as 0024 leaves it) refuses
    at the kept count; downgraded, the function counts the rows again."""
    url = empty_url
    if not url.startswith("postgresql"):
        pytest.skip("PostgreSQL's function (SQLite counts in the session's transaction)")
    upgrade_head(url)
    on_sync(url, lambda c: insert_swarms(c, ("a1", "acme", "running"), ("a2", "acme", "queued")))
    admit = text("SELECT tenant_admit('acme', NULL, NULL, :max, NULL, "
                 "ARRAY['queued','running']::varchar[], 'new')")

    def refused(conn: Connection, limit: int) -> bool:
        try:
            with conn.begin_nested():
                conn.execute(admit, {"max": limit})
        except Exception as exc:
            assert "max_active_swarms" in str(exc)
            return True
        return False

    assert on_sync(url, lambda c: (refused(c, 2), refused(c, 3))) == (True, False)
    # the counts, not the rows: a count row the triggers did not make is read as it is
    on_sync(url, lambda c: c.execute(text(
        "UPDATE tenant_active SET active = active + 1 WHERE tenant = 'acme' AND active > 0 "
        "AND shard = (SELECT min(shard) FROM tenant_active WHERE tenant = 'acme' "
        "AND active > 0)")))
    assert on_sync(url, lambda c: refused(c, 3)) is True
    command.downgrade(alembic_config(url), BEFORE)
    assert on_sync(url, lambda c: refused(c, 3)) is False
