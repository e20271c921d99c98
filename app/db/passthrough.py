"""Ledger rows of the OpenAI facade's passthrough calls (no swarm, no subtask), written ahead
like a swarm's: `in_flight` before the attempt is sent, settled by its answer.

Repository functions: they take a session and never commit; the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.tables import GatewayCall
from app.db.writes import settling_insert
from app.states import AttemptOutcome


@dataclass(frozen=True)
class StaleAttempt:
    model: str
    reserved_usd: Decimal
    prompt_tokens: int
    completion_tokens: int


async def write_call(session: AsyncSession, row: Mapping[str, Any]) -> None:
    """Write an attempt's row: inserted `in_flight` ahead of the attempt, then settled by its
    answer (a settled row is never changed again)."""
    await session.execute(settling_insert(await session.connection()), [dict(row)])


async def settle_stale(session: AsyncSession, before: datetime) -> list[StaleAttempt]:
    """Passthrough attempts written ahead before `before` whose answer never came (their
    process died): `unknown`, billed at their reservation (which the daily caps still hold:
    a reservation outlives its dead owner). Returns them."""
    stale = (GatewayCall.swarm_id.is_(None), GatewayCall.outcome == AttemptOutcome.in_flight,
             GatewayCall.created_at < before)
    rows = [StaleAttempt(*r) for r in (await session.execute(
        select(GatewayCall.model, GatewayCall.reserved_usd, GatewayCall.prompt_tokens,
               GatewayCall.completion_tokens).where(*stale).with_for_update())).all()]
    if rows:
        await session.execute(update(GatewayCall).where(*stale).values(
            outcome=AttemptOutcome.unknown, cost_usd=GatewayCall.reserved_usd, at_bound=True))
    return rows
