"""Swarm rows written straight into the table, and the replay of statements that move them,
for the tests of the trigger-kept counts (tests/db/test_queue_counts.py, test_active_counts.py)."""

from __future__ import annotations

from collections.abc import Callable

from alembic import command
from sqlalchemy import Connection, text

from app.db.migrate import alembic_config
from tests.helpers import on_sync

SWARM_ROW = ("INSERT INTO swarms (id, tenant, status, task, spec, metadata, spent_usd, "
             "reserved_usd, unresolved_usd, prompt_tokens, completion_tokens, gateway_calls, "
             "created_at, lease_epoch, event_seq, rescues, cancel_requested) VALUES (:id, :tenant, "
             ":status, 't', '{}', '{}', 0, 0, 0, 0, 0, 0, '2026-12-01 00:00:00', 0, 0, 0, false)")


def insert_swarms(conn: Connection, *rows: tuple[str, str, str]) -> None:
    for swarm_id, tenant, status in rows:
        conn.execute(text(SWARM_ROW), {"id": swarm_id, "tenant": tenant, "status": status})



def replay(url: str, steps: list[tuple[str, dict[str, int]]],
           agree: Callable[[str], dict[str, int]], before: str) -> None:
    """Each statement, then the counts `agree` reads (kept and counted alike) as expected;
    a TRUNCATE (PostgreSQL) clears them; downgraded to `before`, no trigger is left behind."""
    for sql, expected in steps:
        on_sync(url, lambda c, sql=sql: c.execute(text(sql)))
        assert agree(url) == expected, sql
    if url.startswith("postgresql"):
        on_sync(url, lambda c: c.execute(text("TRUNCATE swarms CASCADE")))
        assert agree(url) == {}
    command.downgrade(alembic_config(url), before)  # and back: no trigger left behind
    on_sync(url, lambda c: insert_swarms(c, ("b1", "acme", "queued")))
    on_sync(url, lambda c: c.execute(text("DELETE FROM swarms")))
