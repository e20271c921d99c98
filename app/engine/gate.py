"""The approval gate's decisions (SPEC §14): a new swarm of named agents held at its creation,
approve (maybe with the reviewer's plan), reject, and the timeout. Each is one transaction of
the caller's on a swarm row locked by it; a held swarm has no owner, so nothing races them.
Every estimate it decides on or records is `forecast`'s: the estimate route's figures."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.config import Settings
from app.db import approval as repo
from app.db import queries
from app.db.create import insert_row
from app.db.session import SessionFactory
from app.db.tables import Subtask, Swarm
from app.db.types import utcnow
from app.db.webhooks import new_delivery
from app.engine import approval
from app.engine.finish import end_swarm, event_row
from app.engine.forecast import forecast
from app.engine.owned_swarm import EngineContext, failure
from app.engine.specs import NewSwarm
from app.engine.subtask_rows import PLANNER
from app.engine.writer import StateWriter
from app.errors import NotAwaitingApproval
from app.states import SwarmStatus, move_swarm
from app.tools.registry import ToolRegistry


async def estimate_of(session: AsyncSession, swarm: Swarm, subs: Sequence[Subtask],
                      settings: Settings, tools: ToolRegistry | None) -> dict[str, Any]:
    """The estimate a swarm's plan carries (`approval.shown`): the estimate route's figures
    from the tenant's history, read with `session`; the budget is what the swarm has left."""
    left = (None if swarm.budget_usd is None
            else swarm.budget_usd - (swarm.spent_usd or Decimal(0)))
    return approval.shown(await forecast(
        session, swarm.tenant, swarm.task, swarm.spec, subs,
        approval.plan_agents(subs, swarm.task), left, settings, tools))


async def estimate_planned(ctx: EngineContext, swarm: Swarm, subs: Sequence[Subtask]
                           ) -> dict[str, Any]:
    """`estimate_of` for a runner's swarm once planned, in a transaction of its own."""
    return await ctx.writer.transact(
        lambda session: estimate_of(session, swarm, subs, ctx.settings, ctx.tools))


async def hold_at_creation(sessions: SessionFactory, new: NewSwarm, settings: Settings,
                           tools: ToolRegistry | None, now: datetime
                           ) -> list[dict[str, Any]] | None:
    """A swarm of named agents whose limits ask for approval: held now when its estimate
    needs it (its rows say `awaiting_approval`; returns the event rows to insert with it),
    else marked `auto` so that no engine asks again. None when it runs at once. The history
    is read only for a swarm whose limits name a rule."""
    swarm = new.swarm
    limits = swarm.spec["limits"]
    if not approval.asks(limits) or swarm.spec.get("agents") is None:
        return None
    async with sessions() as session, session.begin():
        estimate = await estimate_of(session, swarm, new.subtasks, settings, tools)
    if not approval.needed(limits, estimate):
        swarm.approval = {"state": "auto", "estimate": estimate}
        metrics.approvals.labels("auto").inc()
        return None
    swarm.approval, swarm.approval_due_at = approval.awaiting(
        approval.plan_agents(new.subtasks, swarm.task), estimate, now,
        float(limits["approval_timeout_s"]))
    return [event_row(swarm, move_swarm(swarm, SwarmStatus.awaiting_approval, now,
                                        **estimate), now)]


async def write_held(session: AsyncSession, swarm: Swarm,
                     events: Sequence[dict[str, Any]] | None, now: datetime) -> None:
    """What a swarm held at its creation writes beside its rows (`hold_at_creation`'s
    events; None: it was not held): its event, its webhook."""
    if events is None:
        return
    await repo.insert_events(session, events)
    url = swarm.spec.get("webhook_url")
    if url:
        await repo.replace_webhook(session, new_delivery(swarm.id, swarm.tenant, url, now))


async def park(writer: StateWriter, swarm: Swarm, subs: Sequence[Subtask],
               estimate: dict[str, Any], owner: str, epoch: int) -> bool:
    """A runner's swarm held after its plan: `awaiting_approval` with its plan and estimate,
    its event and webhook, its lease given up, in one transaction fenced by that lease
    (False: the lease was lost, nothing written)."""
    now = utcnow()
    block, due = approval.awaiting(approval.plan_agents(subs, swarm.task), estimate, now,
                                   float(swarm.spec["limits"]["approval_timeout_s"]))
    event = event_row(swarm, move_swarm(swarm, SwarmStatus.awaiting_approval, now,
                                        **estimate), now)
    url = swarm.spec.get("webhook_url")
    hook = new_delivery(swarm.id, swarm.tenant, url, now) if url else None
    values = {"status": swarm.status, "event_seq": swarm.event_seq, "approval": block,
              "approval_due_at": due, "reserved_usd": Decimal(0)}
    parked = await writer.transact(lambda session: repo.park(
        session, swarm.id, owner, epoch, values, event, hook))
    swarm.approval, swarm.approval_due_at = block, due
    return parked


def check_awaiting(swarm: Swarm) -> None:
    """409 `not_awaiting_approval` unless the swarm is held for approval."""
    if swarm.status is not SwarmStatus.awaiting_approval:
        raise NotAwaitingApproval(f"swarm is {swarm.status}, not awaiting approval",
                                  details={"status": swarm.status})


async def approve(session: AsyncSession, swarm: Swarm, edited: NewSwarm | None,
                  settings: Settings, tools: ToolRegistry | None, now: datetime) -> None:
    """Queue a held swarm again for an engine to run. `edited`: the swarm as the reviewer's
    request builds it — its spec and budget replace the swarm's, and with agents its workers
    and synthesizer replace the pending ones (the planner's success stays)."""
    check_awaiting(swarm)
    block = swarm.approval
    if edited is not None:
        swarm.spec, swarm.budget_usd = edited.swarm.spec, edited.swarm.budget_usd
        if edited.swarm.spec.get("agents") is not None:
            subs = (await queries.get_subtasks(session, [swarm.id], outputs=False))[swarm.id]
            kept = [s.name for s in subs if s.name == PLANNER]
            fresh = _renumbered(edited.subtasks, swarm.id, len(kept))
            await repo.replace_plan(session, swarm.id, kept, [insert_row(s) for s in fresh])
            block = {**(block or {}), "plan": {"agents": approval.plan_agents(fresh, swarm.task)},
                     "estimate": await estimate_of(session, swarm, fresh, settings, tools)}
    swarm.approval = approval.decided(block, "approved", now)
    swarm.approval_due_at = swarm.lease_owner = swarm.lease_expires_at = None
    await repo.insert_events(session, [
        event_row(swarm, move_swarm(swarm, SwarmStatus.queued, now), now)])
    await repo.drop_webhook(session, swarm.id)  # the notice; the end's delivery follows
    await repo.requeue(session, swarm.id)
    metrics.approvals.labels("approved").inc()


def _renumbered(subs: Sequence[Subtask], swarm_id: str, first: int) -> list[Subtask]:
    for i, s in enumerate(subs):
        s.swarm_id, s.position = swarm_id, first + i
    return list(subs)


async def reject(session: AsyncSession, swarm: Swarm, reason: str | None,
                 now: datetime) -> None:
    """End a held swarm `cancelled`, `error.code = "rejected"`."""
    check_awaiting(swarm)
    await _end(session, swarm, SwarmStatus.cancelled, failure(
        "rejected", reason or "the plan was rejected"), "rejected", now)
    metrics.approvals.labels("rejected").inc()


async def time_out(session: AsyncSession, swarm: Swarm, now: datetime) -> bool:
    """End a held swarm whose wait is over `failed` `approval_timeout` (False: it was decided
    meanwhile, or is not due yet)."""
    if (swarm.status is not SwarmStatus.awaiting_approval or swarm.approval_due_at is None
            or swarm.approval_due_at > now):
        return False
    timeout = swarm.spec["limits"].get("approval_timeout_s")
    await _end(session, swarm, SwarmStatus.failed, failure(
        "approval_timeout", f"not approved within {timeout} s"), "timed_out", now)
    metrics.approvals.labels("timed_out").inc()
    return True


async def _end(session: AsyncSession, swarm: Swarm, status: SwarmStatus,
               err: dict[str, Any], state: str, now: datetime) -> None:
    subs = (await queries.get_subtasks(session, [swarm.id], outputs=False))[swarm.id]
    end = end_swarm(swarm, subs, status, err, now)
    swarm.approval = approval.decided(swarm.approval, state, now)
    swarm.approval_due_at = None
    await repo.insert_events(session, end.events)
    if end.webhook is not None:
        await repo.replace_webhook(session, end.webhook)
    await repo.changed(session, swarm.id)
