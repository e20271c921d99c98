"""A swarm's estimate (SPEC §14) wherever one is asked for: `POST /swarms/estimate`, and the
approval gate at a creation, on an approval with an edited plan and after planning. The plan's
calls laid out, the tenant's ledger history and the caps' room read in the caller's
transaction, the figures from the pure `estimate`: one path, so the gate decides on the figures
the estimate route shows."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db import history
from app.db.tables import Subtask
from app.engine.call_plan import plan_of
from app.engine.estimate import Estimate, estimate
from app.engine.turns import openai_tools
from app.tools.registry import ToolRegistry


async def forecast(session: AsyncSession, tenant: str, task: str, spec: dict[str, Any],
                   subtasks: Sequence[Subtask], agents: list[dict[str, Any]],
                   budget: Decimal | None, settings: Settings, tools: ToolRegistry | None,
                   planning_cost: Decimal | None = None) -> Estimate:
    """The estimate of a swarm laid out by `build_swarm` (or planned): `agents` is the plan
    as it is shown; the history and the caps are read with `session` (never committed)."""

    def definitions(selectors: Sequence[str]) -> list[dict[str, Any]]:
        return [] if tools is None else openai_tools(tools.expand(selectors))

    plan = plan_of(task, spec, subtasks, agents, settings.prices, definitions,
                   settings.tool_result_max_bytes)
    seen = await history.recent_calls(session, tenant)
    caps = await history.caps_left(session, tenant, budget,
                                   settings.tenant_limits(tenant).daily_budget_usd,
                                   settings.daily_budget_usd)
    return estimate(plan, settings.prices, seen, caps, planning_cost)
