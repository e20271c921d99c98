"""Request and response shapes of SPEC §3: strict in, lenient out."""

from __future__ import annotations

import math
import re
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    WrapValidator,
    field_validator,
)
from pydantic_core import PydanticCustomError

NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
# a budget as a string: a plain positive decimal, as JSON spells numbers (Decimal would also
# read "1_000", non-ASCII digits, "Infinity"); `gt`, `max_digits`, `decimal_places` stay the
# validator's (a pattern cannot say them)
BUDGET_PATTERN = r"^\s*\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\s*$"
METADATA_MAX_DEPTH = 32


def _no_nul(v: str) -> str:
    # PostgreSQL text and jsonb cannot store U+0000: refuse it here rather than answer a 500
    if "\x00" in v:
        raise ValueError("must not contain NUL (U+0000) characters")
    return v


def _storable(v: str) -> str:
    """What every database stores: no NUL, and no lone surrogate (UTF-8 cannot encode one)."""
    _no_nul(v)
    try:
        v.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid unicode (no lone surrogates)") from None
    return v


def _json_value(v: Any, depth: int) -> None:
    if depth > METADATA_MAX_DEPTH:
        raise ValueError(f"nested deeper than {METADATA_MAX_DEPTH} levels")
    if isinstance(v, str):
        _storable(v)
    elif isinstance(v, float) and not math.isfinite(v):
        raise ValueError("numbers must be finite (no NaN or Infinity)")
    elif isinstance(v, dict):
        for k, item in v.items():
            _json_value(k, depth)
            _json_value(item, depth + 1)
    elif isinstance(v, list):
        for item in v:
            _json_value(item, depth + 1)


def _json_number(v: Any) -> Any:
    """A number as the schema says: pydantic's lax mode took `true` for 1 and `"8"` for 8
    (`"max_attempts": true` ran one attempt). An integral float stays an integer, as JSON
    Schema has it (`8.0`)."""
    if isinstance(v, bool | str):
        raise PydanticCustomError(
            "number_type", "Input should be a JSON number, not {kind}",
            {"kind": "a boolean" if isinstance(v, bool) else "a string"})
    return v


def _budget_schema(schema: dict[str, Any]) -> None:
    """The string branch of the budget's schema says which strings are read."""
    for branch in schema.get("anyOf", []):
        if branch.get("type") == "string":
            branch["pattern"] = BUDGET_PATTERN


def _retry_budget_schema(schema: dict[str, Any]) -> None:
    """A retry's budget: as any, but never null (None is only its absence)."""
    _budget_schema(schema)
    schema["anyOf"] = [b for b in schema["anyOf"] if b.get("type") != "null"]


# numbers of a request: JSON numbers only (a budget may also be a decimal string: money)
Int = Annotated[int, BeforeValidator(_json_number)]
Number = Annotated[float, BeforeValidator(_json_number)]

Text = Annotated[str, AfterValidator(_storable)]
AgentName = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
MaxTokens = Annotated[Int, Field(ge=1, le=128_000)]
Temperature = Annotated[Number, Field(ge=0, le=2)]
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=64),
                      AfterValidator(_storable)]
MAX_FALLBACK_MODELS = 8


def _distinct_models(v: list[str]) -> list[str]:
    seen: set[str] = set()
    for i, name in enumerate(v):
        if name in seen:
            raise PydanticCustomError("duplicate_model", "{detail}", {
                "detail": f"model {name!r} is listed twice (item {i})"})
        seen.add(name)
    return v


# a model, or models in order of preference: each next one is tried when the one before is
# down (its attempts spent on retryable failures; SPEC §15)
ModelList = Annotated[list[ModelName], Field(min_length=1, max_length=MAX_FALLBACK_MODELS),
                      AfterValidator(_distinct_models)]
_ONE_MODEL: TypeAdapter[str] = TypeAdapter(ModelName)
_MODEL_LIST: TypeAdapter[list[str]] = TypeAdapter(ModelList)


def _model_choice(v: Any, _handler: Any) -> str | list[str]:
    """A name or a list, validated as the one it is: a union's error would name both
    branches (`model.function-after[...]`) where the client wrote `model`."""
    adapter: TypeAdapter[Any] = _MODEL_LIST if isinstance(v, list) else _ONE_MODEL
    try:
        chosen: str | list[str] = adapter.validate_python(v)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PydanticCustomError(first["type"], "{detail}", {
            "detail": f"item {where}: {first['msg']}" if where else first["msg"]}) from None
    return chosen


ModelChoice = Annotated[ModelName | ModelList, WrapValidator(_model_choice), Field(
    description="a model, or a list of models to fall back on in order",
    examples=["kimi-k2.5", ["kimi-k2.5", "deepseek-v3.2"]])]


def model_chain(value: str | list[str]) -> list[str]:
    """A model field's models in order: one name, or the list to fall back on."""
    return [value] if isinstance(value, str) else list(value)


# `server` (all its tools) or `server.tool` (one; MCP tool names are 1-128 of [A-Za-z0-9_.-])
ToolSelector = Annotated[str, StringConstraints(
    pattern=r"^[A-Za-z0-9_-]{1,48}(\.[A-Za-z0-9_.\-]{1,128})?$")]
ToolSelectors = Annotated[list[ToolSelector], Field(min_length=1, max_length=200)]
# a JSON Schema (draft 2020-12), checked when the swarm is built (422 `invalid_schema`)
OutputSchema = Annotated[dict[str, Any] | None, Field(
    default=None,
    description="a JSON Schema (draft 2020-12, at most 64 KiB) the answer must be valid for: "
                "asked of the gateway as response_format json_schema, parsed and repaired "
                "once if it is not")]

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
                                       json_schema_extra=_budget_schema)
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
        _json_value(v, 1)
        return v


class RetryLimits(Limits):
    """A retry's limits; a key left out keeps the old run's value. The budget cannot be
    dropped (`null`): the new swarm stays within the tenant's `max_budget_usd`."""

    budget_usd: Decimal | None = Field(default=None, gt=0, max_digits=20, decimal_places=12,
                                       json_schema_extra=_retry_budget_schema)

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


# ---- responses -------------------------------------------------------------------------------


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorResponse(BaseModel):
    """Every 4xx/5xx answer: `{"error": {"code", "message", "details"}}`."""

    error: ErrorBody


class Progress(BaseModel):
    total: int = 0
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0
    cancelled: int = 0


class SubtaskUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cost_usd: str


class SwarmUsage(SubtaskUsage):
    gateway_calls: int
    unresolved_usd: str = Field(
        default="0", description="the part of cost_usd recorded at an upper bound, not a "
        "usage the gateway reported: attempts whose answer a crash or a cancel lost (billed "
        "at their reservation), answers used that reported no usable usage (billed at their "
        "request's bounds); what the gateway billed for them is at most this")


class SubtaskRead(BaseModel):
    name: str
    kind: str
    status: str
    model: str = Field(description="the model in use: the one that answered, when it did")
    depends_on: list[str]
    attempts: int
    output: str | None = None
    truncated: bool = False
    reused: bool = Field(default=False, description="succeeded in the swarm this one retries: "
                         "its output was copied, no gateway call was made")
    sanitized: bool = Field(default=False, description="the gateway's answer held characters "
                            "no database stores (NUL, lone surrogates): replaced by U+FFFD")
    error: dict[str, Any] | None
    usage: SubtaskUsage
    latency_ms: float | None
    started_at: datetime | None
    finished_at: datetime | None
    turns: int = 0
    tool_calls: int = 0
    fallbacks: int = Field(default=0, description="how many of the subtask's models were "
                           "passed over (down: their attempts spent on retryable failures)")
    output_json: Any = Field(default=None, description="an agent with `output_schema`: its "
                             "answer parsed (left out of lists, as `output` is)")
    output_status: Literal["valid", "repaired", "invalid"] | None = Field(
        default=None, description="an agent with `output_schema`: whether its answer was "
        "valid, repaired (taken from a fence or prose, or after one repair turn) or invalid")
    output_format: Literal["json_schema", "json_object"] | None = Field(
        default=None, description="the response_format its answer was asked with: json_object "
        "where the gateway refused json_schema (the schema then went in the system message)")


class SubtaskDetail(SubtaskRead):
    """One subtask with its tools and the messages of every turn."""

    tools: list[str]
    max_turns: int
    transcript: list[dict[str, Any]]


class LatencyPercentiles(BaseModel):
    p50: float | None
    p95: float | None
    p99: float | None


class Timing(BaseModel):
    wall_s: float | None
    critical_path_s: float
    serial_s: float
    speedup: float | None
    subtask_latency_s: LatencyPercentiles


class VoteRead(BaseModel):
    """`synthesis.strategy: vote`: majority (the winner holds more than half the
    weight), plurality, or no_majority (no two answers agree: the result is synthesized)."""

    outcome: Literal["majority", "plurality", "no_majority"]
    winner: str | None = Field(description="the earliest agent of the winning answer")
    weights: dict[str, float] = Field(
        description="each distinct answer's total weight, under the earliest agent that gave it")


class SwarmRead(BaseModel):
    id: str
    status: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    task: str
    metadata: dict[str, Any]
    spec: dict[str, Any]
    progress: Progress
    subtasks: list[SubtaskRead]
    usage: SwarmUsage
    timing: Timing
    queue_position: int | None
    result: str | None
    error: dict[str, Any] | None
    vote: VoteRead | None = Field(default=None, description="a voted swarm's count")
    retry_of: str | None = Field(default=None, description="the swarm this one retries")
    retried_by: str | None = Field(default=None, description="the newest retry of this swarm")
    erased: bool = Field(default=False, description="its content was erased (DELETE, or the "
                         "retention period): task, metadata, spec, outputs, result and "
                         "event payloads are gone; usage, status and timestamps stay")
    plan: dict[str, Any] | None = Field(
        default=None, description='a swarm held for approval: {"agents": [...]}, postable as '
                                  "`agents` (and to `POST /swarms/{id}/approve`)")
    estimate: dict[str, Any] | None = Field(
        default=None, description="a swarm held for approval: what its plan would cost")


class SwarmList(BaseModel):
    items: list[SwarmRead]
    next_cursor: str | None


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    """`status` alone to a caller without a valid key when keys are configured; the rest names
    the deployment (tool servers, versions), for an authenticated caller."""

    status: str
    database: str | None = None
    revision: str | None = None
    price_table_version: str | None = None
    tool_servers: dict[str, str] | None = None  # server -> starting|up|down
    tenants_version: str | None = None  # SWARM_TENANTS_FILE's (or the built-in defaults')


# ---- usage (GET /usage) and events (GET /swarms/{id}/events) --------------------------------

GroupBy = Literal["model", "day", "tenant"]


class UsageFigures(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = Field(description="part of prompt_tokens, billed at the cached price")
    cost_usd: str = Field(description="exact decimal USD: settled + unresolved",
                          examples=["0.0020872"])
    settled_usd: str = Field(description="the part of cost_usd the gateway's answers reported",
                             examples=["0.0020872"])
    unresolved_usd: str = Field(description="the part of cost_usd recorded at an upper "
                                "bound: attempts whose answer was lost, answers that "
                                "reported no usable usage",
                                examples=["0"])
    gateway_calls: int = Field(description="ledger rows: every attempt, retries included")


class UsageItem(UsageFigures):
    key: str = Field(description="the model, the UTC day (YYYY-MM-DD) or the tenant")


class UsageReport(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: datetime | None = Field(alias="from", description="inclusive; null = all time")
    to: datetime | None = Field(description="exclusive; null = up to now")
    group_by: GroupBy
    items: list[UsageItem]
    total: UsageFigures


class SwarmEvent(BaseModel):
    """One Server-Sent Event of `GET /swarms/{id}/events`, as a client reads it."""

    id: int = Field(description="the per-swarm sequence number (consecutive from 1)")
    event: str = Field(description="swarm.status, subtask.started, subtask.succeeded, "
                       "subtask.failed, subtask.skipped, subtask.turn (a tool-using subtask's "
                       "turn: its tools and their statuses) or swarm.completed (the last one)")
    data: dict[str, Any] = Field(description="the event's JSON body: seq, swarm_id and fields")


# ---- tools (GET /tools, SPEC §9) -------------------------------------------------------------


class ToolRead(BaseModel):
    """One tool an MCP server offers; agents name it `server.name` (or the whole server)."""

    server: str
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=dict)


class ToolList(BaseModel):
    items: list[ToolRead]


# ---- the audit trail (GET /audit) ----

AuditAction = Literal["create", "cancel", "retry", "approve", "reject", "erase", "chat",
                      "passthrough"]


class AuditEntry(BaseModel):
    time: datetime
    tenant: str
    key_id: str | None = Field(description="the id of the caller's API key (never the key); "
                               "null while the API has no keys")
    action: AuditAction
    swarm_id: str | None = Field(description="the swarm the change is about (a retry's: the "
                                 "new swarm); null for a passthrough call")
    request_id: str | None = Field(description="the request's X-Request-Id, else its trace "
                                   "id, else one the service made")
    client: str | None = Field(description="the client's address as the service saw it")


class AuditPage(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "items": [{"time": "2026-12-05T10:31:07.412000Z", "tenant": "acme", "key_id": "ci",
                   "action": "cancel", "swarm_id": "0b6f1c2e-8d1a-4a57-9c3e-2f7d9e6b1a44",
                   "request_id": "4bf92f3577b34da6a3ce929d0e0e4736", "client": "10.0.3.7"}],
        "next_cursor": "YTEyMw"}]})

    items: list[AuditEntry]
    next_cursor: str | None
