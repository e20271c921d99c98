"""How a swarm ends — the one path for the runner's finish and a cancel of a queued swarm —
and how a move's event becomes a numbered row."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import approval, queries, spend
from app.db.columns import SWARM_TOTAL_COLUMNS
from app.db.notify import CANCEL, notify
from app.db.session import db_now
from app.db.tables import Event as EventTable
from app.db.tables import Subtask, Swarm
from app.db.webhooks import new_delivery
from app.engine.owned_swarm import EventRow, WebhookRow
from app.states import Event, SubtaskStatus, SwarmStatus, move_subtask, move_swarm

log = logging.getLogger(__name__)


def event_row(swarm: Swarm, event: Event, now: datetime) -> EventRow:
    """Number the event with the swarm's next sequence number (SSE `id:`)."""
    swarm.event_seq += 1
    return {"swarm_id": swarm.id, "seq": swarm.event_seq, "type": event.type,
            "data": event.data, "created_at": now}


def log_end(swarm: Swarm, status: SwarmStatus, duration_s: float,
            err: dict[str, Any] | None) -> None:
    """A swarm's end (SPEC §17): status, cost, duration, gateway calls; the error's code,
    never its message (a gateway's may echo the prompt)."""
    extra: dict[str, Any] = {
        "swarm_id": swarm.id, "tenant": swarm.tenant, "status": status.value,
        "cost_usd": float(swarm.spent_usd), "duration_s": round(duration_s, 3),
        "calls": swarm.gateway_calls}
    if err is not None:
        extra["error_code"] = err.get("code")
    log.info("swarm %s ended %s: %s USD in %.3f s, %d gateway calls", swarm.id, status.value,
             swarm.spent_usd, duration_s, swarm.gateway_calls, extra=extra)


@dataclass
class Ending:
    """What ending a swarm changes: its subtasks, the events in order, the webhook due."""

    changed: list[Subtask] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    webhook: WebhookRow | None = None


def end_swarm(swarm: Swarm, subtasks: Iterable[Subtask], status: SwarmStatus,
              err: dict[str, Any] | None, now: datetime) -> Ending:
    """Move the swarm to `status` in memory. Subtasks in flight are cancelled; pending ones
    are cancelled when the caller stopped the swarm (a cancel, its deadline), skipped when it
    ended on its own (a failure)."""
    stopped_by_user = status is SwarmStatus.cancelled or (
        err is not None and err.get("code") == "deadline_exceeded")
    end = Ending()
    for s in subtasks:
        if s.status is SubtaskStatus.running or (
            stopped_by_user and s.status is SubtaskStatus.pending
        ):
            move_subtask(s, SubtaskStatus.cancelled, now)
        elif s.status is SubtaskStatus.pending:
            skipped = move_subtask(s, SubtaskStatus.skipped, now, reason="swarm stopped")
            assert skipped is not None
            end.events.append(event_row(swarm, skipped, now))
        else:
            continue
        end.changed.append(s)
    swarm.error = err
    completed = move_swarm(swarm, status, now, error=err, cancelled=[
        s.name for s in end.changed if s.status is SubtaskStatus.cancelled])
    end.events.append(event_row(swarm, completed, now))
    url = swarm.spec.get("webhook_url")
    end.webhook = new_delivery(swarm.id, swarm.tenant, url, now) if url else None
    return end


async def cancel(session: AsyncSession, swarm: Swarm) -> bool:
    """Cancel an active swarm the caller loaded locked (`get_swarm(..., for_update=True)`), in
    the caller's transaction: the row's changes are written when it commits. Nobody runs a
    queued swarm without a live lease: it ends here (True). Otherwise its owner, or the next
    one, learns of the flag and ends it (False); an owner about to start it must not be
    raced, since a cancel here would not fence its writes. A swarm awaiting approval has no
    owner either."""
    now = await db_now(session)
    swarm.cancel_requested = True
    unowned = swarm.lease_owner is None or (
        swarm.lease_expires_at is not None and swarm.lease_expires_at < now)
    if swarm.status in (SwarmStatus.queued, SwarmStatus.awaiting_approval) and unowned:
        # fence a lapsed owner out: paused, it would resume, renew the lease it still names
        # and run a swarm ended here (its writes passing the fence, a second end stored)
        swarm.lease_epoch += 1
        swarm.lease_owner = swarm.lease_expires_at = None
        if swarm.reserved_usd:
            # its creation wrote its first calls ahead (create.Ahead), which that owner may
            # have sent before it lapsed: billed `unknown` at their reservations, as a
            # takeover bills a dead owner's (settled in the database: the totals read back)
            await spend.settle_in_flight(session, swarm.id)
            await session.refresh(swarm, list(SWARM_TOTAL_COLUMNS))
            swarm.reserved_usd = Decimal(0)
        subs = (await queries.get_subtasks(session, [swarm.id], outputs=False))[swarm.id]
        end = end_swarm(swarm, subs, SwarmStatus.cancelled, None, now)
        await session.execute(insert(EventTable), end.events)
        if end.webhook is not None:  # in place of a held swarm's approval notice
            await approval.replace_webhook(session, end.webhook)
        return True
    await notify(session, CANCEL, [swarm.id])  # the flag is written with the row, at commit
    return False
