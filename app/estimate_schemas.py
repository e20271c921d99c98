"""The answer of `POST /swarms/estimate` (SPEC §14), shared with the client."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

EXAMPLE_ESTIMATE: dict[str, Any] = {
    "plan": {"agents": [
        {"name": "code_analyst", "prompt": None, "system_prompt": "You are a senior code "
         "analyst.", "model": "kimi-k2.5", "depends_on": [], "tools": None},
        {"name": "risk_auditor", "prompt": None, "system_prompt": "You are a security auditor.",
         "model": "deepseek-v3.2", "depends_on": [], "tools": None},
    ]},
    "width": 2, "depth": 1,
    "calls": {"expected": 3.0, "max": 3},
    "tokens": {"expected": 1421, "max": 6968},
    "cost_usd": {"expected": "0.0021", "p90": "0.0029", "max": "0.0131"},
    "reservation_usd": "0.0131",
    "fits": {"budget": True, "tenant_daily": True, "daily": True},
    "basis": {"samples": 240, "since": "2026-12-01T09:30:00+00:00"},
}


class PlannedAgent(BaseModel):
    """An agent of the plan, shaped as `agents` of a request (postable as it is)."""

    model_config = ConfigDict(extra="allow")

    name: str
    prompt: str | None = None
    system_prompt: str = ""
    model: str | list[str] = Field(description="a model, or the models to fall back on")
    depends_on: list[str] = Field(default_factory=list)
    tools: list[str] | None = None


class EstimatePlan(BaseModel):
    agents: list[PlannedAgent]


class CallCount(BaseModel):
    expected: float = Field(description="gateway calls expected (tool agents' turns counted)")
    max: int = Field(description="calls at most: one per agent, every turn of a tool agent")


class TokenCount(BaseModel):
    expected: int
    max: int = Field(description="the prompt bounds and max_tokens the reservations price")


class CostRange(BaseModel):
    expected: str = Field(description="exact decimal USD, from the tenant's recent calls")
    p90: str
    max: str = Field(description="what the run reserves over its calls (one attempt each)")


class Fits(BaseModel):
    """Whether each cap has room now for the worst case (`cost_usd.max`); a cap that is not
    set always fits."""

    budget: bool
    tenant_daily: bool
    daily: bool


class Basis(BaseModel):
    samples: int = Field(description="the tenant's recent ledger rows the figures rest on "
                                     "(0: prompt sizes and max_tokens alone)")
    since: datetime | None = Field(description="the oldest of them")


class SwarmEstimate(BaseModel):
    """What a swarm would do and cost; nothing is created."""

    model_config = ConfigDict(json_schema_extra={"examples": [EXAMPLE_ESTIMATE]})

    plan: EstimatePlan
    width: int = Field(description="the most agents that can run at once")
    depth: int = Field(description="agents on the longest dependency chain")
    calls: CallCount
    tokens: TokenCount
    cost_usd: CostRange
    reservation_usd: str = Field(description="the most the run holds reserved at once: its "
                                             "limits.concurrency largest calls' worst cases")
    fits: Fits
    basis: Basis
    planning_cost_usd: str | None = Field(
        default=None, description="what planning cost (billed), when the planner ran")
