"""Request shapes of SPEC §3 (strict: an unknown field is a 422), with their examples."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)
from pydantic_core import PydanticCustomError

from app.schemas.fields import (
    BUDGET_PATTERN,
    AgentName,
    Int,
    MaxTokens,
    ModelChoice,
    Number,
    OutputSchema,
    Temperature,
    Text,
    ToolSelectors,
    budget_schema,
    json_value,
    retry_budget_schema,
)

EXAMPLE_REQUEST: dict[str, Any] = {
    "task": "Review the v1 -> v2 migration of our FastAPI payment service",
    "agents": [
        {"name": "code_analyst", "system_prompt": "You are a senior code analyst."},
        {"name": "risk_auditor", "system_prompt": "You are a security auditor.",
         "model": ["deepseek-v3.2", "kimi-k2.5"]},
        {"name": "test_designer", "system_prompt": "You are a QA engineer.",
         "depends_on": ["code_analyst"]},
        {"name": "doc_writer", "system_prompt": "You write release notes.",
         "prompt": "Write the notes",
         "depends_on": ["code_analyst", "risk_auditor", "test_designer"]},
    ],
    "synthesis": {"strategy": "synthesize", "model": "kimi-k2.5", "max_tokens": 2000},
    "model": "kimi-k2.5",
    "max_tokens": 1500,
    "temperature": 0.3,
    "limits": {"concurrency": 8, "budget_usd": 5.0, "failure_tolerance": 0.0,
               "max_attempts": 3, "subtask_timeout_s": 60, "deadline_s": 900},
    "metadata": {"ticket": "PAY-1234"},
}


EXAMPLE_STRUCTURED: dict[str, Any] = {
    "task": "Review the v2 release of the payment service",
    "agents": [
        {"name": "reviewer", "system_prompt": "You are a release reviewer.",
         "output_schema": {
             "type": "object",
             "properties": {"verdict": {"enum": ["ship", "hold"]},
                            "risks": {"type": "array", "items": {"type": "string"}}},
             "required": ["verdict", "risks"], "additionalProperties": False}},
        {"name": "writer", "system_prompt": "You write release notes.",
         "depends_on": ["reviewer"]},
    ],
    "synthesis": {"strategy": "none"},
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AgentCreate(Strict):
    name: AgentName
    system_prompt: Text = ""
    prompt: Text | None = None
    model: ModelChoice | None = None
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    depends_on: list[AgentName] = Field(default_factory=list, max_length=1000)
    weight: Number = Field(default=1.0, gt=0, le=1e6)
    tools: ToolSelectors | None = None
    max_turns: Int = Field(default=8, ge=1, le=50)
    output_schema: OutputSchema = None


class OrchestratorOptions(Strict):
    model: ModelChoice | None = None
    system_prompt: Text = Field(default="", max_length=100_000,
                                description="the caller's guidance, added to the planner's "
                                            "instructions")
    max_subtasks: Int = Field(default=8, ge=1, le=1000)
    max_depth: Int = Field(default=3, ge=1, le=20)
    routing: Literal["auto", "pinned"] = Field(
        default="auto", description="auto: a planned subtask runs on the planner's priced "
                                    "model hint; pinned: every worker on the swarm's model")


class SynthesisOptions(Strict):
    strategy: Literal["synthesize", "concatenate", "vote", "none"] = "synthesize"
    model: ModelChoice | None = None
    max_tokens: MaxTokens | None = None
    compress: Literal["auto", "always", "never"] = "auto"
    output_schema: OutputSchema = None


class ApprovalAboveUsd(Strict):
    """Approval when the expected cost is above this many USD."""

    above_usd: Decimal = Field(ge=0, max_digits=20, decimal_places=12,
                               json_schema_extra={"type": ["string", "number"],
                                                  "examples": ["2.50"]})

    @field_validator("above_usd", mode="before")
    @classmethod
    def _usd_string(cls, v: Any) -> Any:
        if isinstance(v, bool) or (isinstance(v, str)
                                   and re.fullmatch(BUDGET_PATTERN, v) is None):
            raise PydanticCustomError(
                "decimal_parsing", 'Input should be a decimal number (e.g. 2.5 or "2.50")')
        return v


class ApprovalAboveAgents(Strict):
    """Approval when the plan has more than this many agents."""

    above_agents: Int = Field(ge=0, le=1_000_000)


Approval = Literal["never", "always"] | ApprovalAboveUsd | ApprovalAboveAgents


class Limits(Strict):
    concurrency: Int = Field(default=8, ge=1, le=1000)
    budget_usd: Decimal | None = Field(default=None, gt=0, max_digits=20, decimal_places=12,
                                       json_schema_extra=budget_schema)
    failure_tolerance: Number = Field(default=0.0, ge=0, le=1)
    max_attempts: Int = Field(default=3, ge=1, le=10)
    subtask_timeout_s: Number = Field(default=60.0, gt=0, le=3600)
    deadline_s: Number = Field(default=900.0, gt=0, le=86_400)
    max_tool_calls: Int = Field(default=1000, ge=1, le=1_000_000)
    # workers' tokens as they come (`subtask.delta` events, the facade's frames): the calls
    # stream from the gateway; off, each output arrives whole when its worker ends
    stream_tokens: bool = False
    # the approval gate (SPEC §14): who must say yes before the workers run, and how long
    # a swarm may wait for it
    approval: Approval = Field(default="never", description='"never" | "always" | '
                               '{"above_usd": "2.50"} (expected cost) | {"above_agents": 20}')
    approval_timeout_s: Number = Field(default=86_400.0, gt=0, le=30 * 86_400)

    @field_validator("budget_usd", mode="before")
    @classmethod
    def _budget_string(cls, v: Any) -> Any:
        if isinstance(v, str) and re.fullmatch(BUDGET_PATTERN, v) is None:
            raise PydanticCustomError(
                "decimal_parsing", 'Input should be a positive decimal number (e.g. 5 or "5.00")')
        return v


class SwarmCreate(Strict):
    """The body of `POST /swarms`; only `task` is required."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [EXAMPLE_REQUEST,
                                                                       EXAMPLE_STRUCTURED]})

    task: Text = Field(min_length=1, max_length=1_000_000)
    agents: list[AgentCreate] | None = Field(default=None, min_length=1)
    orchestrator: OrchestratorOptions = Field(default_factory=OrchestratorOptions)
    synthesis: SynthesisOptions = Field(default_factory=SynthesisOptions)
    model: ModelChoice | None = None
    max_tokens: MaxTokens = 1500
    temperature: Temperature | None = None
    limits: Limits = Field(default_factory=Limits)
    metadata: dict[str, Any] = Field(default_factory=dict)
    webhook_url: Text | None = Field(default=None, max_length=2048)
    tools: ToolSelectors | None = None  # what the planner may hand to planned subtasks

    @field_validator("task")
    @classmethod
    def _task_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("task must not be empty")
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata_storable(cls, v: dict[str, Any]) -> dict[str, Any]:
        json_value(v, 1)
        return v


class RetryLimits(Limits):
    """A retry's limits; a key left out keeps the old run's value. The budget cannot be
    dropped (`null`): the new swarm stays within the tenant's `max_budget_usd`."""

    budget_usd: Decimal | None = Field(default=None, gt=0, max_digits=20, decimal_places=12,
                                       json_schema_extra=retry_budget_schema)

    @field_validator("budget_usd", mode="before")
    @classmethod
    def _budget_not_null(cls, v: Any) -> Any:
        if v is None:
            raise PydanticCustomError(
                "budget_null", "a retry's budget cannot be null: leave budget_usd out to keep "
                               "the old run's budget")
        return v


class SwarmRetry(Strict):
    """The optional body of `POST /swarms/{id}/retry`: limits for the new run (keys left out
    keep the old run's values)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"limits": {"budget_usd": 10.0}}]})

    limits: RetryLimits | None = None


class SwarmApprove(Strict):
    """The optional body of `POST /swarms/{id}/approve`: the plan as the reviewer edited it
    (it replaces the plan, validated like a request's `agents`) and limits for the run (keys
    left out keep the swarm's)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"agents": [{"name": "researcher", "prompt": "Find the three main risks"},
                    {"name": "writer", "prompt": "Write the summary",
                     "depends_on": ["researcher"]}],
         "limits": {"budget_usd": "2.00"}}]})

    agents: list[AgentCreate] | None = Field(default=None, min_length=1)
    limits: RetryLimits | None = None


class SwarmReject(Strict):
    """The optional body of `POST /swarms/{id}/reject`."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"reason": "too many agents for this task"}]})

    reason: Text | None = Field(default=None, max_length=2000)
