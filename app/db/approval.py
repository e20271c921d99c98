"""The approval gate's statements (SPEC §14): a runner parks its swarm (fenced by its lease,
which it gives up), a decision replaces the plan and queues the swarm again, and the sweep
finds the swarms whose wait is over."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import table_of
from app.db.batch import executemany
from app.db.notify import CHANGED, QUEUED, notify
from app.db.tables import Event, Subtask, Swarm, Webhook
from app.states import SubtaskStatus, SwarmStatus


async def park(session: AsyncSession, swarm_id: str, owner: str, epoch: int,
               values: dict[str, Any], event: dict[str, Any],
               webhook: dict[str, Any] | None) -> bool:
    """Write a swarm's move to `awaiting_approval` (`values`: its status, event number,
    approval block and due time) with its event and webhook, and give up its lease: only
    while this owner still holds it at this epoch. False when it does not (nothing written)."""
    parked = (await session.execute(
        update(Swarm)
        .where(Swarm.id == swarm_id, Swarm.lease_owner == owner, Swarm.lease_epoch == epoch)
        .values(**values, lease_owner=None, lease_expires_at=None)
        .returning(Swarm.id)
    )).scalar_one_or_none()
    if parked is None:
        return False
    await session.execute(insert(Event), [event])
    if webhook is not None:
        await replace_webhook(session, webhook)
    await notify(session, CHANGED, [swarm_id])
    return True


async def replace_webhook(session: AsyncSession, webhook: dict[str, Any]) -> None:
    """Make a swarm's webhook due (one delivery row per swarm: an earlier one, its approval
    notice, gives way)."""
    await session.execute(delete(Webhook).where(Webhook.swarm_id == webhook["swarm_id"]))
    await session.execute(insert(Webhook).values(**webhook))


async def drop_webhook(session: AsyncSession, swarm_id: str) -> None:
    """Forget a swarm's approval notice once it is decided: the terminal delivery follows."""
    await session.execute(delete(Webhook).where(Webhook.swarm_id == swarm_id))


async def replace_plan(session: AsyncSession, swarm_id: str, keep: Sequence[str],
                       new: Sequence[dict[str, Any]]) -> None:
    """The reviewer's plan: the swarm's pending subtasks other than `keep` go, `new` (every
    column) come in."""
    await session.execute(delete(Subtask).where(
        Subtask.swarm_id == swarm_id, Subtask.status == SubtaskStatus.pending,
        Subtask.name.not_in(list(keep))))
    if new:
        await executemany(await session.connection(), insert(table_of(Subtask)), list(new))


async def requeue(session: AsyncSession, swarm_id: str) -> None:
    """Wake the engines (on commit) for a swarm queued again."""
    await notify(session, QUEUED, [swarm_id])
    await notify(session, CHANGED, [swarm_id])


async def changed(session: AsyncSession, swarm_id: str) -> None:
    """Tell other replicas' readers (on commit) that the swarm changed."""
    await notify(session, CHANGED, [swarm_id])


async def insert_events(session: AsyncSession, events: Sequence[dict[str, Any]]) -> None:
    if events:
        await session.execute(insert(Event), list(events))


async def overdue(session: AsyncSession, now: datetime, limit: int) -> list[str]:
    """Swarms awaiting approval past their due time, oldest due first (by its index)."""
    rows = await session.execute(
        select(Swarm.id).where(Swarm.approval_due_at < now,
                               Swarm.status == SwarmStatus.awaiting_approval)
        .order_by(Swarm.approval_due_at).limit(limit))
    return list(rows.scalars())
