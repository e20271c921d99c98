"""Ledger rows of the OpenAI facade's passthrough calls (no swarm, no subtask), written ahead
like a swarm's: `in_flight` before the attempt is sent, settled by its answer.

Repository functions: they take a session and never commit; the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.tables import GatewayCall
from app.db.writes import settling_insert


async def write_call(session: AsyncSession, row: Mapping[str, Any]) -> None:
    """Write an attempt's row: inserted `in_flight` ahead of the attempt, then settled by its
    answer (a settled row is never changed again)."""
    await session.execute(settling_insert(await session.connection()), [dict(row)])


async def settle_stale(session: AsyncSession, before: datetime) -> int:
    """Passthrough attempts written ahead before `before` whose answer never came (their
    process died): `unknown`, billed at their reservation. Returns how many."""
    result = await session.execute(
        update(GatewayCall)
        .where(GatewayCall.swarm_id.is_(None), GatewayCall.outcome == "in_flight",
               GatewayCall.created_at < before)
        .values(outcome="unknown", cost_usd=GatewayCall.reserved_usd, at_bound=True))
    return int(getattr(result, "rowcount", 0) or 0)
