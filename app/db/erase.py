"""Erasing a swarm's content (SPEC §16), for DELETE /swarms/{id}, the retention sweep and
`swarm-api prune`: the task, prompts, outputs, transcripts (tool arguments and results), event
payloads, result, metadata and spec go; the id, tenant, status, timestamps, usage, error codes,
the ledger and the tool ledger stay, so spend reports and the daily caps do not move. The
caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, bindparam, delete, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import table_of
from app.db.session import db_now, is_postgres
from app.db.tables import Event, GatewayCall, Subtask, Swarm, TranscriptMessage, Webhook
from app.states import TERMINAL_SWARM, AttemptOutcome

_SUBTASKS = table_of(Subtask)
# what an erased swarm's events carry instead of their payloads
ERASED_EVENT: dict[str, Any] = {"erased": True}
ERASED_MESSAGE = "erased"
# one sweep at a time across replicas: each batch's transaction holds this (PostgreSQL)
_SWEEP_LOCK = text("SELECT pg_try_advisory_xact_lock(hashtext('swarm-retention'))")


def erased_error(error: dict[str, Any] | None) -> dict[str, Any] | None:
    """An error as an erased swarm keeps it: its code, and how many failed subtasks had each
    code; the message and other details (a gateway's or a tool's words) go."""
    if error is None:
        return None
    details = error.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return {"code": error.get("code"), "message": ERASED_MESSAGE,
            "details": {"causes": causes} if isinstance(causes, dict) else None}


async def erase_swarm(session: AsyncSession, swarm: Swarm, now: datetime) -> bool:
    """Erase a terminal swarm the caller holds (its row locked); False when it was already
    erased. Its lease epoch moves on, so a late write of its last runner is fenced out."""
    assert swarm.status.terminal, swarm.status
    if swarm.erased_at is not None:
        return False
    await session.execute(
        update(Swarm).where(Swarm.id == swarm.id).values(
            task="", spec={}, meta={}, result=None, error=erased_error(swarm.error),
            erased_at=now, lease_owner=None, lease_expires_at=None,
            lease_epoch=Swarm.lease_epoch + 1),
        execution_options={"synchronize_session": False})
    await session.execute(
        update(Subtask).where(Subtask.swarm_id == swarm.id)
        .values(system_prompt=None, prompt=None, output=None, output_json=None),
        execution_options={"synchronize_session": False})
    failed = (await session.execute(
        select(Subtask.id, Subtask.error)
        .where(Subtask.swarm_id == swarm.id, Subtask.error.is_not(None)))).all()
    if failed:
        await session.execute(
            update(_SUBTASKS).where(_SUBTASKS.c.id == bindparam("sid"))
            .values(error=bindparam("err")),
            [{"sid": sid, "err": erased_error(err)} for sid, err in failed],
            execution_options={"synchronize_session": False})
    await session.execute(
        update(Event).where(Event.swarm_id == swarm.id).values(data=ERASED_EVENT),
        execution_options={"synchronize_session": False})
    await session.execute(delete(TranscriptMessage)
                          .where(TranscriptMessage.swarm_id == swarm.id))
    # a pending delivery is dropped; a sender holding it finds no row to record into
    await session.execute(delete(Webhook).where(Webhook.swarm_id == swarm.id))
    swarm.erased_at = now
    return True


@dataclass(frozen=True)
class Rule:
    """Which swarms are old enough to erase: those that ended more than `older_than` ago, of
    `tenants` (None: any) but none of `except_tenants`."""

    older_than: timedelta
    tenants: tuple[str, ...] | None = None
    except_tenants: tuple[str, ...] = ()

    def where(self, now: datetime) -> ColumnElement[bool]:
        cond = ((Swarm.erased_at.is_(None)) & Swarm.finished_at.is_not(None)
                & (Swarm.finished_at < now - self.older_than)
                & Swarm.status.in_([s.value for s in TERMINAL_SWARM]))
        if self.tenants is not None:
            cond &= Swarm.tenant.in_(self.tenants)
        if self.except_tenants:
            cond &= Swarm.tenant.not_in(self.except_tenants)
        return cond


async def count_erasable(session: AsyncSession, rules: Sequence[Rule]) -> int:
    """How many swarms the rules would erase now (`prune --dry-run`)."""
    now = await db_now(session)
    total = 0
    for rule in rules:
        total += (await session.execute(
            select(func.count()).select_from(Swarm).where(rule.where(now)))).scalar_one()
    return int(total)


async def erase_batch(session: AsyncSession, rules: Sequence[Rule], limit: int, *,
                      skip_locked: bool) -> int:
    """Erase up to `limit` swarms the rules name, oldest end first. A row another transaction
    holds (a retry copying it, a DELETE) is skipped for a later batch (`skip_locked`), else
    waited for; either way a swarm is erased after that transaction, never under it."""
    now = await db_now(session)
    done = 0
    for rule in rules:
        if done >= limit:
            break
        stmt = (select(Swarm).where(rule.where(now)).order_by(Swarm.finished_at)
                .limit(limit - done)
                .with_for_update(skip_locked=skip_locked)
                .execution_options(populate_existing=True))
        for swarm in (await session.execute(stmt)).scalars():
            # a row waited for is read again as its holder left it: erased, say
            done += await erase_swarm(session, swarm, now)
    return done


async def sweep_lock(session: AsyncSession) -> bool:
    """Whether this transaction may run a sweep batch: no other replica's is running (SQLite:
    one process, its transactions one at a time)."""
    if not is_postgres(session):
        return True
    return bool((await session.execute(_SWEEP_LOCK)).scalar_one())


async def prune_ledger(session: AsyncSession, before: datetime, tenant: str | None,
                       *, dry_run: bool, limit: int = 5000) -> int:
    """Ledger rows (gateway attempts) recorded before `before`: all counted (`dry_run`), or
    up to `limit` removed (one batch). Only settled ones: an attempt in flight is money not
    yet known."""
    cond = (GatewayCall.created_at < before) & (GatewayCall.outcome != AttemptOutcome.in_flight)
    if tenant is not None:
        cond &= GatewayCall.tenant == tenant
    if dry_run:
        return int((await session.execute(
            select(func.count()).select_from(GatewayCall).where(cond))).scalar_one())
    batch = select(GatewayCall.id).where(cond).limit(limit).scalar_subquery()
    result = await session.execute(delete(GatewayCall).where(GatewayCall.id.in_(batch)),
                                   execution_options={"synchronize_session": False})
    return int(getattr(result, "rowcount", 0) or 0)
