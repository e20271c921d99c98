"""NOTIFY channels (payload: one swarm id; swarm_changed adds its status) and sending them
inside a transaction."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.session import is_postgres

QUEUED = "swarm_queued"    # a swarm was created: workers claim
CANCEL = "swarm_cancel"    # cancel requested: its owner stops it at once
CHANGED = "swarm_changed"  # a swarm's state was committed: readers (?wait=, SSE) re-read
_NOTIFY = text("SELECT pg_notify(:channel, id) FROM unnest(CAST(:ids AS text[])) AS id")


async def notify(session: AsyncSession, channel: str, swarm_ids: Sequence[str]) -> None:
    """NOTIFY inside the caller's transaction (delivered on commit); no-op on SQLite, whose
    single process wakes its readers in memory."""
    if swarm_ids and is_postgres(session):
        await session.execute(_NOTIFY, {"channel": channel, "ids": list(swarm_ids)})
