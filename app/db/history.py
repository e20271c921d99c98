"""A tenant's recent calls as the estimate reads them (SPEC §14): one aggregate statement
over its last ledger rows, and what each daily cap has left today.

Repository functions: they take a session and never commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Integer, Select, and_, bindparam, cast, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import spend
from app.db.tables import GatewayCall, Subtask
from app.db.tenant_cap import tenant_left as tenant_cap_left
from app.db.types import utcnow
from app.states import AttemptOutcome, SubtaskKind

# fewer calls than this of a model and kind are no history: the estimate falls back
MIN_SAMPLES = 3
# the window: a tenant's last this-many successful calls of swarms, at most this many days old
WINDOW_CALLS = 1000
WINDOW_DAYS = 30


@dataclass(frozen=True, slots=True)
class Bucket:
    """The tenant's recent successful calls of one (model, kind, tools) as sums."""

    calls: int
    subtasks: int
    prompt_tokens: int
    completion_tokens: int
    completion_squares: int  # sum of squared completion tokens: the spread
    turns_squares: int  # sum over subtasks of their calls squared (tool agents' turns)


@dataclass(frozen=True, slots=True)
class History:
    buckets: Mapping[tuple[str, str, bool], Bucket]
    samples: int = 0
    since: datetime | None = None

    def of(self, model: str, kind: SubtaskKind, tools: bool) -> Bucket | None:
        found = self.buckets.get((model, str(kind), tools))
        return found if found is not None and found.calls >= MIN_SAMPLES else None


@dataclass(frozen=True, slots=True)
class Caps:
    """What each cap has left now (None: no such cap)."""

    budget: Decimal | None = None
    tenant_daily: Decimal | None = None
    daily: Decimal | None = None


def _statement() -> Select[Any]:
    """`recent_calls`' one statement: per (model, kind, tools) the calls, subtasks and sums
    of tokens and squares over the window (`tenant`, `since`, `calls` bound when it runs)."""
    g = GatewayCall
    window = (select(g.swarm_id, g.subtask_name, g.model, g.prompt_tokens,
                     g.completion_tokens, g.created_at)
              .where(g.tenant == bindparam("tenant"), g.created_at >= bindparam("since"),
                     g.outcome == AttemptOutcome.ok, g.swarm_id.is_not(None), g.at_bound.is_(False))
              .order_by(g.created_at.desc()).limit(bindparam("calls", type_=Integer))
              .subquery("w"))
    per_sub = (select(window.c.swarm_id, window.c.subtask_name, window.c.model,
                      func.count().label("n"),
                      func.sum(window.c.prompt_tokens).label("p"),
                      func.sum(window.c.completion_tokens).label("c"),
                      func.sum(window.c.completion_tokens * window.c.completion_tokens)
                      .label("cc"),
                      func.min(window.c.created_at).label("first"))
               .group_by(window.c.swarm_id, window.c.subtask_name, window.c.model)
               .subquery("s"))
    tools = cast(Subtask.turns > 0, Integer)
    return (
        select(per_sub.c.model, Subtask.kind, tools, func.count(), func.sum(per_sub.c.n),
               func.sum(per_sub.c.n * per_sub.c.n), func.sum(per_sub.c.p),
               func.sum(per_sub.c.c), func.sum(per_sub.c.cc), func.min(per_sub.c.first))
        .join(Subtask, and_(Subtask.swarm_id == per_sub.c.swarm_id,
                            Subtask.name == per_sub.c.subtask_name))
        .group_by(per_sub.c.model, Subtask.kind, tools))


# built once, its values bound when it runs: building it anew is a good share of an
# estimate's CPU
HISTORY = _statement()


def window(tenant: str, calls: int = WINDOW_CALLS, days: int = WINDOW_DAYS) -> dict[str, Any]:
    """`HISTORY`'s parameters: the tenant's last `calls` successful calls of `days` days."""
    return {"tenant": tenant, "since": utcnow() - timedelta(days=days), "calls": calls}


async def recent_calls(session: AsyncSession, tenant: str, *, calls: int = WINDOW_CALLS,
                       days: int = WINDOW_DAYS) -> History:
    """Tokens per call by model, subtask kind and whether the subtask used tools, over the
    tenant's last `calls` successful calls of the last `days` days: read newest first along
    `ix_gateway_calls_tenant_created` and stopped at `calls` (never the whole ledger), then
    summed per subtask (a tool agent's calls are its turns) and per bucket."""
    rows = (await session.execute(HISTORY, window(tenant, calls, days))).all()
    buckets: dict[tuple[str, str, bool], Bucket] = {}
    first = None
    for model, kind, with_tools, subs, n, nn, p, c, cc, oldest in rows:
        buckets[(model, str(kind), bool(with_tools))] = Bucket(
            int(n), int(subs), int(p), int(c), int(cc), int(nn))
        first = oldest if first is None or oldest < first else first
    return History(buckets, sum(b.calls for b in buckets.values()), first)


async def caps_left(session: AsyncSession, tenant: str, budget: Decimal | None,
                    tenant_cap: Decimal | None, global_cap: Decimal | None) -> Caps:
    """What the swarm's budget, the tenant's daily cap and the service's have left now."""
    tenant_left = None
    if tenant_cap is not None:
        tenant_left = await tenant_cap_left(session, tenant, tenant_cap)
    daily_left = None
    if global_cap is not None:
        daily_left = (await spend.peek_daily(session, global_cap)).left
    return Caps(budget, tenant_left, daily_left)


async def billed(session: AsyncSession, keys: Sequence[str]) -> Decimal:
    """What the ledger billed the calls of these idempotency keys (every attempt)."""
    total = (await session.execute(
        select(func.sum(GatewayCall.cost_usd))
        .where(GatewayCall.idempotency_key.in_(list(keys))))).scalar_one_or_none()
    return Decimal(total or 0)
