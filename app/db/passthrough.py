"""Ledger rows of the OpenAI facade's passthrough calls (no swarm, no subtask).

Repository functions: they take a session and never commit; the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Table
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.tables import GatewayCall

_TABLE = cast(Table, GatewayCall.__table__)


async def insert_calls(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ledger rows; one already there (same key and attempt: a retried commit) stays."""
    if not rows:
        return
    pg = session.get_bind().dialect.name == "postgresql"
    stmt = (pg_insert if pg else sqlite_insert)(_TABLE).on_conflict_do_nothing()
    await session.execute(stmt, [dict(r) for r in rows])
