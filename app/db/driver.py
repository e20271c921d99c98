"""Statements outside SQLAlchemy's execution (PostgreSQL only): one asyncpg connection of the
group commit's own, and a statement alone on a pooled connection's driver.

A group commit is one statement (`commit_statement.py`) that needs nothing of the engine: no
session, no transaction, no result objects. Through the pool it still cost a checkout, the
autocommit switch and its reset, the greenlet hand-offs and a checkin, each waiting its turn
on a busy loop, many times what the server spends on the statement, and every subtask waits
for one before its call is sent (docs/decisions/0002-group-commit-one-statement.md). Used by
one caller at a time (the writer's loop); reconnected on the next use after the connection was lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from app.db.retry import database_unavailable
from app.db.session import asyncpg_dsn

CONNECT_TIMEOUT_S = 5.0
APPLICATION_NAME = "swarm-api group commit"  # how pg_stat_activity names it
# The group commit's statements are planned once per shape and that plan kept from the first
# run (`commit_statement`: written so the plan made for any arguments, at any table size, probes
# each row by its key; tests/perf/test_group_commit_plan.py). Left to choose, PostgreSQL plans the
# first five runs for their arguments and then compares: where the generic plan's estimate
# came out above the custom ones' it planned every commit anew
# (docs/decisions/0009-plans-postgresql-keeps.md).
SETTINGS = {"application_name": APPLICATION_NAME, "plan_cache_mode": "force_generic_plan"}


class DirectConnection:
    def __init__(self, database_url: str) -> None:
        self._dsn = asyncpg_dsn(database_url)
        self._conn: asyncpg.Connection | None = None

    async def fetch(self, sql: str, args: Sequence[Any]) -> list[asyncpg.Record]:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(
                self._dsn, timeout=CONNECT_TIMEOUT_S,
                server_settings=SETTINGS)
        try:
            rows: list[asyncpg.Record] = await self._conn.fetch(sql, *args)
        except Exception as exc:
            if database_unavailable(exc):  # maybe half-dead: the retry gets a new one
                await self.close()
            raise
        return rows

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)


async def fetchrow_pooled(engine: AsyncEngine, sql: str, args: Sequence[Any]
                         ) -> asyncpg.Record | None:
    """`sql` as a transaction of its own (autocommit) on a pooled connection's driver: no
    BEGIN, no COMMIT, none of SQLAlchemy's execution around its one round trip; its first row
    (None: none). A connection that lost the database is invalidated, not handed out again.

    The connection is the pool's own (`raw_connection`: the checkout and its events, the
    checkin), not an engine `Connection` around it, which costs a third greenlet hand-off
    (its start, `get_raw_connection`, its close), its objects and a proxy registered a
    checkout, for a statement that uses none of it (docs/decisions/0037-creation-cpu.md)."""
    pooled = await engine.raw_connection()
    try:
        driver = pooled.driver_connection
        assert driver is not None  # a checked-out connection has one
        row: asyncpg.Record | None = await driver.fetchrow(sql, *args)
    except Exception as exc:
        if database_unavailable(exc):
            await greenlet_spawn(pooled.invalidate, exc)
        raise
    finally:
        # the checkin may close the connection (invalidated, or over the pool's size): the
        # driver's close is awaited inside SQLAlchemy's greenlet
        await greenlet_spawn(pooled.close)
    return row
