"""A takeover's settling: the attempts a dead owner left in flight become `unknown`, billed at
their reservations, before the new owner runs the swarm again."""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.db import spend
from app.db.leases import LeaseLost, record_takeover
from app.engine.run_state import RunnerState
from app.pricing import metric_model_label

# the runner's log: the settling is a line of the swarm's run
log = logging.getLogger("app.engine.runner")


async def settle_lost(state: RunnerState) -> list[dict[str, Any]]:
    """A takeover: the dead owner's attempts in flight become `unknown`, billed at their
    reservations, and the takeover is recorded when fruitless (one transaction, lease
    checked); the runner's totals follow. The fruitless takeovers counted so far."""
    s = state.swarm

    async def settle(session: AsyncSession) -> tuple[spend.Takeover, list[dict[str, Any]]
                                                     ] | None:
        took = await spend.settle_lost_attempts(
            session, s.id, state.epoch, state.ctx.owner, state.ctx.settings.lease_seconds)
        if took is None:
            return None
        return took, await record_takeover(
            session, s.id, state.epoch, [a.subtask_name for a in took.lost])

    settled = await state.ctx.writer.transact(settle)
    if settled is None:
        raise LeaseLost(s.id)
    took, takeovers = settled
    for a in took.lost:
        s.spent_usd += a.cost_usd
        s.unresolved_usd += a.cost_usd
        s.prompt_tokens += a.prompt_tokens
        s.completion_tokens += a.completion_tokens
        s.gateway_calls += 1
        state.budget.record(a.cost_usd)
        sub = state.subs.get(a.subtask_name)
        if sub is not None:
            sub.cost_usd += a.cost_usd
            sub.prompt_tokens += a.prompt_tokens
            sub.completion_tokens += a.completion_tokens
        metrics.count_unknown(metric_model_label(a.model, state.ctx.prices),
                              float(a.cost_usd), a.prompt_tokens, a.completion_tokens)
    for name, n in took.attempts.items():
        if name in state.subs:
            state.subs[name].attempts = max(state.subs[name].attempts, n)
    if took.lost:
        log.warning("swarm %s: %d attempts of a dead owner settled as unknown (%s USD)",
                    s.id, len(took.lost), sum((a.cost_usd for a in took.lost), Decimal(0)))
    return takeovers
