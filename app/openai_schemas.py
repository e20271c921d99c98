"""Shapes of the OpenAI-compatible facade (SPEC §10): the chat-completions request with its
`agent_swarm` extension, the answers (`chat.completion`, `chat.completion.chunk`, the model
list) and OpenAI's error body."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from app.schemas import (
    Approval,
    Int,
    MaxTokens,
    ModelChoice,
    Number,
    Temperature,
    model_chain,
)

FanIn = Literal["weighted_vote", "majority", "concatenate", "synthesize"]

EXAMPLE_SWARM: dict[str, Any] = {
    "model": ["kimi-k2.5", "deepseek-v3.2"],  # the second when the first is down
    "messages": [
        {"role": "system", "content": "You are the root orchestrator. Split the work into "
                                      "independent sub-tasks and delegate them in parallel."},
        {"role": "user", "content": "Review these 3 Python files for SQL injection, "
                                    "hard-coded secrets and unsafe deserialisation."},
    ],
    "agent_swarm": {"enabled": True, "max_sub_agents": 8, "fan_in_strategy": "weighted_vote",
                    "failure_tolerance": 0.02, "per_sub_agent_max_tokens": 512},
    "temperature": 0.3,
    "max_tokens": 4096,
}
EXAMPLE_STRUCTURED_SWARM: dict[str, Any] = {
    "model": "kimi-k2.5",
    "messages": [{"role": "user", "content": "Is the v2 release of the payment service ready?"}],
    "response_format": {"type": "json_schema", "json_schema": {
        "name": "verdict", "strict": True,
        "schema": {"type": "object", "properties": {"ready": {"type": "boolean"},
                                                    "why": {"type": "string"}},
                   "required": ["ready", "why"], "additionalProperties": False}}},
    "agent_swarm": {"enabled": True, "max_sub_agents": 4},
}
EXAMPLE_PASSTHROUGH: dict[str, Any] = {
    "model": "deepseek-v3.2",
    "messages": [{"role": "user", "content": "Say hello"}],
    "max_tokens": 64,
}


class AgentSwarmOptions(BaseModel):
    """`agent_swarm` (the SDK's `extra_body`): runs a swarm instead of one completion.
    An unknown key is refused with 400, naming it."""

    model_config = ConfigDict(extra="forbid")

    # flags are JSON booleans only, as OpenAI's API takes them: pydantic's lax bool took
    # `"enabled": 0` (or "no") for false, which the schema refuses
    enabled: StrictBool = Field(description="true runs a swarm; false (or no `agent_swarm`) "
                                            "sends the request to the gateway unchanged")
    max_sub_agents: Int | None = Field(
        default=None, ge=1, le=1000, description="the planner's bound: orchestrator.max_subtasks")
    fan_in_strategy: FanIn | None = Field(
        default=None, description="weighted_vote | majority -> vote, concatenate -> "
                                  "concatenate, absent (or synthesize) -> synthesize")
    failure_tolerance: Number | None = Field(
        default=None, ge=0, le=1, description="limits.failure_tolerance")
    per_sub_agent_max_tokens: MaxTokens | None = Field(
        default=None, description="each worker's max_tokens")
    streaming: StrictBool | None = Field(
        default=None, description="with `stream: true`: absent, each worker's output framed "
                                  "whole as it finishes; true, workers' tokens framed as they "
                                  "come (limits.stream_tokens); false, only the result")
    tools: list[str] | None = Field(
        default=None, max_length=100,
        description="MCP tools the planner may hand to sub-agents: `server` or "
                    "`server.tool`")
    concurrency: Int | None = Field(
        default=None, ge=1, le=1000, description="sub-agents in flight at once: "
                                                 "limits.concurrency")
    budget_usd: Decimal | None = Field(
        default=None, gt=0, max_digits=20, decimal_places=12,
        description="the swarm's hard cap in USD: limits.budget_usd")
    deadline_s: Number | None = Field(
        default=None, gt=0, le=86_400, description="the swarm's deadline: limits.deadline_s")
    approval: Approval | None = Field(
        default=None, description='limits.approval: "always", {"above_usd": "2.50"} or '
                                  '{"above_agents": 20}; a swarm held for approval answers 202 '
                                  "with `swarm_status: awaiting_approval` and its `swarm_id`")
    routing: Literal["pinned", "auto"] = Field(
        default="pinned", description="pinned: every worker runs on `model`; auto: the "
                                      "planner's model hints pick workers' models")


class ChatMessage(BaseModel):
    """One message; extra keys (name, tool_calls, ...) pass through to the gateway."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1, max_length=32)
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: StrictBool = False


class ChatCompletionCreate(BaseModel):
    """The body of `POST /v1/chat/completions`. Without `agent_swarm` every other OpenAI
    parameter passes to the gateway unchanged; with it, only those listed here are accepted."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"examples": [EXAMPLE_SWARM, EXAMPLE_STRUCTURED_SWARM,
                                         EXAMPLE_PASSTHROUGH]})

    model: ModelChoice = Field(description="a model, or (with agent_swarm) a list of models "
                                           "to fall back on in order")
    messages: list[ChatMessage] = Field(min_length=1, max_length=10_000)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    agent_swarm: AgentSwarmOptions | None = None

    @property
    def first_model(self) -> str:
        """The model asked for first: the one a passthrough names, a swarm's answer's."""
        return model_chain(self.model)[0]


# ---- answers ---------------------------------------------------------------------------------


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: str | None = Field(default=None, description="exact decimal USD (swarms only)")


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str


class ChatCompletion(BaseModel):
    """A `chat.completion`. For a swarm: the result, the summed usage of all its gateway calls,
    `id = chatcmpl-<swarm id>` and `swarm_id`; passthrough answers are the gateway's own."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage | None = None
    swarm_id: str | None = None


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    """One `data:` event of a stream (the stream ends with `data: [DONE]`)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
    swarm_id: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "swarm-api"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its `$defs` inlined (for a media type FastAPI does not
    register components for, such as an event stream's events)."""
    schema = model.model_json_schema()
    defs: dict[str, Any] = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.rsplit("/", 1)[1]])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    swarm_id: str | None = Field(default=None, description="the swarm, when one was created")


class OpenAIError(BaseModel):
    """Every error of a /v1 route, in OpenAI's shape."""

    error: OpenAIErrorBody
