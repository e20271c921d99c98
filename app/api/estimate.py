"""`POST /swarms/estimate` (SPEC §14): what a swarm would do and cost, creating nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from fastapi import APIRouter, Request, Response

from app.api.admission import Admission, rate_limit
from app.api.deps import KeyFirstRoute, SessionDep, TenantDep
from app.api.errors import error_responses
from app.api.shared import swarm_answer
from app.config import Settings
from app.db import tenant_cap
from app.engine.budget import BudgetExceeded, SharedCap
from app.engine.call_plan import named_agents, planned_agents
from app.engine.forecast import forecast
from app.engine.planning import PlanFailed, Planning
from app.engine.specs import build_swarm
from app.errors import ApiError, RequestInvalid, TooManyRequests
from app.estimate_schemas import SwarmEstimate
from app.gateway.errors import GatewayError, GatewayRejected
from app.pricing import usd_str
from app.schemas import AgentCreate, SwarmCreate
from app.tools.registry import ToolRegistry
from app.views import to_json
from app.webhook_policy import check_webhook_url

router = APIRouter(prefix="/swarms", tags=["swarms"], route_class=KeyFirstRoute)


class GatewayFailed(ApiError):
    status_code = 503
    code = "gateway_unavailable"


@router.post("/estimate", response_model=SwarmEstimate,
             responses=error_responses(400, 401, 413, 415, 422, 429, 503),
             summary="Estimate a swarm's plan and cost before it runs")
async def estimate_swarm(body: SwarmCreate, request: Request, session: SessionDep,
                         tenant: TenantDep) -> Response:
    """The body of `POST /swarms`, validated as it is there; nothing is created. Named agents:
    no gateway call. Without agents the planner runs (billed: `planning_cost_usd`) and its
    plan comes back as `plan.agents`, ready to post."""
    state = request.app.state
    settings: Settings = state.settings
    tools: ToolRegistry | None = state.tools
    admission = Admission(tenant, settings.tenant_limits(tenant), settings.max_agents,
                          checked=False)
    body = admission.swarm(body)  # the tenant's quotas on agents and budget (SPEC §8)
    new = build_swarm(body, settings, tenant, tools=tools)
    if body.webhook_url is not None:
        await check_webhook_url(body.webhook_url, settings, tenant)
    planning_cost: Decimal | None = None
    if body.agents is None:  # a planning call costs money: the tenant's bucket and cap first
        await rate_limit(session, tenant, settings)
        agents = await _plan(request, body, new.swarm.spec, tenant)
        planning_cost = agents[1]
        body = body.model_copy(update={"agents": [AgentCreate.model_validate(a)
                                                  for a in agents[0]]})
        new = build_swarm(body, settings, tenant, tools=tools)
        shown = agents[0]
    else:
        shown = named_agents(new.swarm.spec)
    async with session.begin():
        result = await forecast(session, tenant, body.task, new.swarm.spec, new.subtasks, shown,
                                body.limits.budget_usd, settings, tools, planning_cost)
    return swarm_answer(to_json(result.view()))


async def _plan(request: Request, body: SwarmCreate, spec: dict[str, Any],
                tenant: str) -> tuple[list[dict[str, Any]], Decimal]:
    """The planner's plan as postable agents, and what planning cost."""
    state = request.app.state
    settings: Settings = state.settings
    gates = state.tenant_gates
    cap = state.daily if gates is None else gates.cap(tenant)
    caps: list[SharedCap] = [cap] if cap is not None else []
    planning = Planning(state.gateway, state.sessions, settings.prices, caps, tenant,
                        body.limits.budget_usd, body.limits.max_attempts,
                        body.limits.subtask_timeout_s, settings.lease_seconds)
    try:
        planned = await planning.plan(body.task, spec)
    except PlanFailed as exc:
        raise RequestInvalid(f"the plan is invalid after one repair: {exc}", code="plan_invalid",
                             details={**exc.invalid.details,
                                      "planning_cost_usd": usd_str(exc.cost)}) from None
    except BudgetExceeded as exc:
        if exc.scope == "swarm":
            raise RequestInvalid(str(exc), code="budget_exceeded", details={
                "field": "limits.budget_usd", "needed_usd": usd_str(exc.needed)}) from None
        raise TooManyRequests(str(exc), limit="daily_budget_usd", retry_after_s=float(
            tenant_cap.seconds_to_midnight(datetime.now(UTC)))) from None
    except GatewayError as exc:
        code = "gateway_rejected" if isinstance(exc, GatewayRejected) else "gateway_unavailable"
        raise GatewayFailed(f"planning failed: {exc}", code=code) from None
    return planned_agents(planned.plan, body.task, spec, settings.prices), planned.cost
