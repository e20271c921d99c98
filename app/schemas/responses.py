"""Response shapes of SPEC §3 (lenient: a client ignores a field it does not know)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
)

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
