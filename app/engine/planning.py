"""Planning with no swarm (an estimate's, SPEC §14): the orchestrator's call and its one
repair, as the engine's planner makes them, metered like a passthrough call (reserved on the
daily caps and the request's budget, a ledger row per attempt with no swarm), billed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from app.db import history
from app.db.session import SessionFactory
from app.engine import planner as plans
from app.engine.budget import BudgetExceeded, SharedCap
from app.engine.context import estimate_prompt_tokens
from app.engine.passthrough import PassthroughMeter
from app.gateway.chat import ChatRequest, ChatResult
from app.gateway.client import GatewayClient
from app.pricing import PriceTable


@dataclass(frozen=True, slots=True)
class Planned:
    plan: list[plans.PlannedSubtask]
    cost: Decimal  # what planning was billed, from its ledger rows


class PlanFailed(Exception):
    """The plan is still invalid after its repair call (both billed)."""

    def __init__(self, invalid: plans.PlanInvalid, cost: Decimal) -> None:
        super().__init__(str(invalid))
        self.invalid = invalid
        self.cost = cost


@dataclass
class Planning:
    """One estimate's planning: its gateway, ledger, caps and limits."""

    gateway: GatewayClient
    sessions: SessionFactory
    prices: PriceTable
    caps: Sequence[SharedCap]
    tenant: str
    budget: Decimal | None
    max_attempts: int
    timeout_s: float
    lease_s: float

    async def plan(self, task: str, spec: dict[str, Any]) -> Planned:
        """The validated plan of `task` under the request's orchestrator options; raises
        PlanFailed, BudgetExceeded or the gateway client's errors (what was billed stays
        billed)."""
        limits = spec["orchestrator"]
        offered = spec.get("tools") or []
        model, max_tokens = limits["model"], plans.planner_max_tokens(limits["max_subtasks"])
        first = plans.planner_messages(task, limits["max_subtasks"], limits["max_depth"],
                                       self.prices.names(), limits.get("system_prompt") or "",
                                       offered)
        keys: list[str] = []
        try:
            result = await self._call(model, max_tokens, first, spec, keys)
            try:
                plan = plans.parse_plan(result.content, result.finish_reason,
                                        limits["max_subtasks"], limits["max_depth"], offered)
            except plans.PlanInvalid as bad:
                repair = plans.repair_messages(first, result.content, bad)
                result = await self._call(model, max_tokens, repair, spec, keys)
                plan = plans.parse_plan(result.content, result.finish_reason,
                                        limits["max_subtasks"], limits["max_depth"], offered)
        except plans.PlanInvalid as still:
            raise PlanFailed(still, await self._cost(keys)) from None
        return Planned(plan, await self._cost(keys))

    async def _call(self, model: str, max_tokens: int, messages: list[dict[str, str]],
                    spec: dict[str, Any], keys: list[str]) -> ChatResult:
        price = self.prices[model]
        bound = estimate_prompt_tokens(messages)
        worst = price.worst_case(bound, max_tokens)
        if self.budget is not None:
            spent = await self._cost(keys)
            if worst > self.budget - spent:
                raise BudgetExceeded("swarm", worst, self.budget - spent)
        meter = PassthroughMeter(self.sessions, price, self.caps, self.tenant, worst,
                                 prompt_bound=bound, max_tokens=max_tokens,
                                 lease_s=self.lease_s)
        keys.append(meter.key)
        try:
            result = await self.gateway.complete(
                ChatRequest(model=model, messages=messages, max_tokens=max_tokens,
                            temperature=spec.get("temperature"),
                            response_format=plans.JSON_OBJECT, idempotency_key=meter.key),
                max_attempts=self.max_attempts, timeout_s=self.timeout_s,
                before_attempt=meter.before, after_attempt=meter.after)
        finally:
            await meter.release()
        meter.finished(result.finish_reason)
        return result

    async def _cost(self, keys: list[str]) -> Decimal:
        if not keys:
            return Decimal(0)
        async with self.sessions() as session:
            return await history.billed(session, keys)
