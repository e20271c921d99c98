"""`agent_swarm` requests of the facade: the request mapped onto a SwarmCreate (SPEC §10),
the swarm created exactly as `POST /swarms` creates one, then waited for or streamed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask

from app.api import swarms
from app.api.admission import Admission
from app.api.follow import POLL_S, follow_events, follow_with_deltas
from app.api.frames import Frames
from app.api.openai_errors import openai_error, seconds_to_midnight
from app.config import Settings
from app.db import queries
from app.db.session import SessionFactory
from app.db.tables import Swarm
from app.db.types import utcnow
from app.engine.deltas import Delta
from app.engine.specs import FACADE_SOURCE, request_hash
from app.engine.waiters import SwarmNotifier
from app.errors import ApiError, Refused, RequestInvalid
from app.openai_schemas import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionCreate,
    ChatMessage,
    Choice,
    ChunkChoice,
    ChunkDelta,
    CompletionUsage,
)
from app.pricing import usd_str
from app.schemas import SwarmCreate
from app.states import SwarmStatus

# what a swarm can honour besides model, messages and agent_swarm; any other parameter -> 400
SWARM_PARAMS = frozenset({"stream", "stream_options", "max_tokens", "max_completion_tokens",
                          "temperature", "user", "response_format"})
FAN_IN = {"weighted_vote": "vote", "majority": "vote", "concatenate": "concatenate",
          "synthesize": "synthesize", None: "synthesize"}
GUIDING_ROLES = ("system", "developer")
# a SwarmCreate field named in an error -> the request's own name for it
FIELDS = (("orchestrator.max_subtasks", "agent_swarm.max_sub_agents"),
          ("limits.failure_tolerance", "agent_swarm.failure_tolerance"),
          ("synthesis.max_tokens", "max_tokens"),
          ("max_tokens", "agent_swarm.per_sub_agent_max_tokens"),
          ("tools", "agent_swarm.tools"), ("task", "messages"),
          ("orchestrator.system_prompt", "messages"),
          ("limits.concurrency", "agent_swarm.concurrency"),
          ("limits.budget_usd", "agent_swarm.budget_usd"),
          ("limits.deadline_s", "agent_swarm.deadline_s"),
          ("limits.approval", "agent_swarm.approval"),
          ("synthesis.output_schema", "response_format.json_schema.schema"))
WAIT_GRACE_S = 30.0  # beyond the swarm's deadline: queueing, synthesis, the final commit


def _text(message: ChatMessage, index: int) -> str:
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for j, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError("a swarm reads text only", code="unsupported_content",
                           details={"field": f"messages.{index}.content.{j}"})
        parts.append(part["text"])
    return "".join(parts)


def swarm_request(req: ChatCompletionCreate) -> SwarmCreate:
    """The SwarmCreate of SPEC §10 for an `agent_swarm` request."""
    options = req.agent_swarm
    assert options is not None
    for key in req.model_extra or {}:
        if key not in SWARM_PARAMS:
            raise ApiError(f"{key} is not supported with agent_swarm",
                           code="unsupported_parameter", details={"field": key})
    guidance = [_text(m, i) for i, m in enumerate(req.messages) if m.role in GUIDING_ROLES]
    turns = [(m.role, _text(m, i)) for i, m in enumerate(req.messages)
             if m.role not in GUIDING_ROLES]
    if not turns:
        raise RequestInvalid("messages need a user message: it is the swarm's task",
                             details={"field": "messages"})
    # one user message is the task; a conversation is the task as a transcript
    task = turns[0][1] if len(turns) == 1 else "\n\n".join(f"{r}: {t}" for r, t in turns)
    spec: dict[str, Any] = {
        "task": task, "model": req.model, "temperature": req.temperature,
        # the caller's model runs every worker unless it asks the planner to route
        "orchestrator": {"system_prompt": "\n\n".join(guidance), "routing": options.routing},
        "synthesis": {"strategy": FAN_IN[options.fan_in_strategy],
                      "max_tokens": req.max_tokens or req.max_completion_tokens},
        "metadata": {"source": FACADE_SOURCE},
    }
    if (schema := _result_schema((req.model_extra or {}).get("response_format"))) is not None:
        spec["synthesis"]["output_schema"] = schema
    if options.max_sub_agents is not None:
        spec["orchestrator"]["max_subtasks"] = options.max_sub_agents
    limits = {"failure_tolerance": options.failure_tolerance,
              "concurrency": options.concurrency, "budget_usd": options.budget_usd,
              "deadline_s": options.deadline_s, "approval": options.approval,
              "stream_tokens": True if options.streaming and req.stream else None}
    if any(v is not None for v in limits.values()):
        spec["limits"] = {k: v for k, v in limits.items() if v is not None}
    if options.per_sub_agent_max_tokens is not None:
        spec["max_tokens"] = options.per_sub_agent_max_tokens
    if options.tools is not None:
        if "tools" not in SwarmCreate.model_fields:
            raise ApiError("this service has no tools", code="unsupported_parameter",
                           details={"field": "agent_swarm.tools"})
        spec["tools"] = options.tools
    try:
        return SwarmCreate.model_validate(spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = request_field(".".join(str(p) for p in first["loc"]))
        raise RequestInvalid(f"{field}: {first['msg']}", details={"field": field}) from exc


def _result_schema(fmt: Any) -> Any:
    """The schema `response_format` asks of the swarm's result (SPEC §15: the synthesizer's
    `output_schema`): json_schema's own, any object for json_object, none for text."""
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = fmt.get("json_schema") if kind == "json_schema" else None
    if not isinstance(spec, dict) or "schema" not in spec:
        raise RequestInvalid("response_format must be text, json_object, or json_schema with "
                             "a schema", details={"field": "response_format"})
    return spec["schema"]


def _sdk_retry(request: Request) -> bool:
    """Whether the OpenAI SDK sent this as a retry (`x-stainless-retry-count` >= 1)."""
    count = request.headers.get("x-stainless-retry-count", "")
    return count.isdigit() and int(count) >= 1


def request_field(field: str) -> str:
    """The request's name for a SwarmCreate field (`tools.0` -> `agent_swarm.tools.0`)."""
    for ours, theirs in FIELDS:
        if field == ours or field.startswith(ours + "."):
            return theirs + field[len(ours):]
    return field


def _usage(swarm: Swarm) -> CompletionUsage:
    return CompletionUsage(prompt_tokens=swarm.prompt_tokens,
                           completion_tokens=swarm.completion_tokens,
                           total_tokens=swarm.prompt_tokens + swarm.completion_tokens,
                           cost_usd=usd_str(swarm.spent_usd))


def _failure(swarm: Swarm) -> Response:
    """A swarm that did not succeed, as an error the SDK raises (and must not retry)."""
    err = swarm.error or {}
    code = str(err.get("code") or swarm.status)
    message = f"swarm {swarm.id} {swarm.status}: {err.get('message', code)}"
    if swarm.status == SwarmStatus.cancelled:
        return openai_error(409, message, "swarm_cancelled", swarm_id=swarm.id, retry=False)
    if code == "daily_budget_exceeded":
        return openai_error(429, message, code, swarm_id=swarm.id,
                            headers={"Retry-After": str(seconds_to_midnight())}, retry=False)
    return openai_error(502, message, code, swarm_id=swarm.id, retry=False)


class SwarmCall:
    """One `agent_swarm` request: create the swarm, then answer when it ends."""

    def __init__(self, request: Request, req: ChatCompletionCreate, tenant: str) -> None:
        self.req = req
        self.tenant = tenant
        self.sessions: SessionFactory = request.app.state.sessions
        self.notifier: SwarmNotifier = request.app.state.notifier
        self.settings: Settings = request.app.state.settings
        self.deadline = time.monotonic()
        self.created = int(time.time())

    async def create(self, request: Request, idempotency_key: str | None,
                     admission: Admission) -> str:
        """The swarm, created by the very code of `POST /swarms` (validation, prices, idempotency,
        local adoption); returns its id."""
        body = swarm_request(self.req)
        if idempotency_key is None and _sdk_retry(request):
            # a proxy timed the first try out: the SDK's retry answers from that swarm
            twin = await self._twin(admission.swarm(body))  # hashed as it is stored
            if twin is not None:
                self.deadline = time.monotonic() + body.limits.deadline_s + WAIT_GRACE_S
                return twin
        try:
            # SPEC §8: it creates a swarm: `max_active_swarms` is counted in the insert's
            # transaction (RateLimitDep took the token: no second one)
            answer = await swarms.create_swarm(
                body=body, request=request, response=Response(), tenant=self.tenant,
                admission=admission.counting_in(), idempotency_key=idempotency_key,
                traceparent=request.headers.get("traceparent"))
        except (ApiError, Refused) as exc:  # name the request's field, not the swarm's
            if isinstance(exc.details, dict) and isinstance(exc.details.get("field"), str):
                exc.details = {**exc.details, "field": request_field(exc.details["field"])}
            raise
        self.deadline = time.monotonic() + body.limits.deadline_s + WAIT_GRACE_S
        return answer.headers["location"].removeprefix("/swarms/")  # a new one's, or a replay's

    async def _twin(self, body: SwarmCreate) -> str | None:
        """A swarm this tenant created from the same body within its deadline."""
        since = utcnow() - timedelta(seconds=body.limits.deadline_s)
        async with self.sessions() as s, s.begin():
            return await queries.recent_twin(s, self.tenant, request_hash(body), since)

    async def _swarm(self, swarm_id: str) -> Swarm | None:
        async with self.sessions() as s, s.begin():
            return await queries.get_swarm(s, swarm_id, self.tenant)

    async def held(self, swarm_id: str) -> Response | None:
        """With `agent_swarm.approval`: once the swarm is planned, the answer when it is held
        for approval — 202, an empty `chat.completion` with `swarm_status:
        awaiting_approval` and `swarm_id` (SPEC §10) — else None (it runs: answer as ever)."""
        options = self.req.agent_swarm
        if options is None or options.approval in (None, "never"):
            return None
        while (left := self.deadline - time.monotonic()) > 0:
            async with self.sessions() as s, s.begin():
                status = await queries.get_status(s, swarm_id, self.tenant)
            if status is SwarmStatus.awaiting_approval:
                swarm = await self._swarm(swarm_id)
                assert swarm is not None
                return JSONResponse(ChatCompletion(
                    id=f"chatcmpl-{swarm.id}", created=int(swarm.created_at.timestamp()),
                    model=self.req.model, swarm_id=swarm.id, usage=_usage(swarm),
                    swarm_status=SwarmStatus.awaiting_approval.value,
                    choices=[Choice(message=AssistantMessage(content=""),
                                    finish_reason="stop")]).model_dump(mode="json"),
                    status_code=202, headers={"Location": f"/swarms/{swarm.id}"})
            if status not in (SwarmStatus.queued, SwarmStatus.planning):
                return None
            await self.notifier.wait(swarm_id, min(left, POLL_S))
        return None

    async def answer(self, swarm_id: str) -> Response | ChatCompletion:
        """Wait until the swarm is terminal (up to its deadline), then the completion."""
        async def status() -> SwarmStatus | None:
            async with self.sessions() as s, s.begin():
                return await queries.get_status(s, swarm_id, self.tenant)

        await self.notifier.until_ended(swarm_id, self.deadline, status, POLL_S)
        swarm = await self._swarm(swarm_id)
        if swarm is None or not swarm.status.terminal:
            return openai_error(503, f"swarm {swarm_id} did not finish in time; read it at "
                                     f"/swarms/{swarm_id}", "swarm_not_finished",
                                swarm_id=swarm_id, headers={"Retry-After": "30"}, retry=False)
        if swarm.status != SwarmStatus.succeeded:
            return _failure(swarm)
        return ChatCompletion(
            id=f"chatcmpl-{swarm.id}", created=int(swarm.created_at.timestamp()),
            model=self.req.first_model, swarm_id=swarm.id, usage=_usage(swarm),
            choices=[Choice(message=AssistantMessage(content=swarm.result or ""),
                            finish_reason="stop")])

    def stream(self, swarm_id: str, ended: Callable[[], None]) -> EventSourceResponse:
        """`chat.completion.chunk` events from the swarm's events table: each worker's output
        framed as it succeeds, then the result, then [DONE]. The swarm runs on without us.
        `ended` (idempotent) runs when the stream ends, its reader gone too, or after the
        response if it never started."""
        async def chunks() -> AsyncIterator[dict[str, str]]:
            try:
                async for chunk in self._chunks(swarm_id):
                    yield chunk
            finally:
                ended()

        return EventSourceResponse(chunks(), ping=self.settings.sse_ping_s,
                                   headers={"x-swarm-id": swarm_id},
                                   background=BackgroundTask(ended))

    def _chunk(self, swarm_id: str, delta: ChunkDelta, finish: str | None = None,
               usage: CompletionUsage | None = None, empty: bool = False) -> dict[str, str]:
        chunk = ChatCompletionChunk(
            id=f"chatcmpl-{swarm_id}", created=self.created, model=self.req.first_model,
            swarm_id=swarm_id, usage=usage,
            choices=[] if empty else [ChunkChoice(delta=delta, finish_reason=finish)])
        return {"data": chunk.model_dump_json(exclude_none=True)}

    async def _chunks(self, swarm_id: str) -> AsyncIterator[dict[str, str]]:
        streaming = self.req.agent_swarm.streaming if self.req.agent_swarm else None
        yield self._chunk(swarm_id, ChunkDelta(role="assistant", content=""))
        if streaming is not False:  # each worker's frame; its tokens too when asked
            async for text in self._frames(swarm_id, tokens=streaming is True):
                yield self._chunk(swarm_id, ChunkDelta(content=text))
        swarm = await self._swarm(swarm_id)
        if swarm is None or swarm.status != SwarmStatus.succeeded:
            failure = _failure(swarm) if swarm is not None else openai_error(
                502, f"swarm {swarm_id} is gone", "swarm_missing", swarm_id=swarm_id)
            yield {"data": bytes(failure.body).decode()}
            return
        yield self._chunk(swarm_id, ChunkDelta(content=swarm.result or ""))
        yield self._chunk(swarm_id, ChunkDelta(), finish="stop")
        options = self.req.stream_options
        if options is not None and options.include_usage:
            yield self._chunk(swarm_id, ChunkDelta(), usage=_usage(swarm), empty=True)
        yield {"data": "[DONE]"}

    async def _frames(self, swarm_id: str, tokens: bool) -> AsyncIterator[str]:
        """Workers' frames until the swarm ends: whole as each worker succeeds or, with
        `tokens`, filled as their text comes, one open at a time (app/api/frames.py)."""
        frames = Frames()
        follow = follow_with_deltas if tokens else follow_events
        async for ev in follow(self.sessions, self.notifier, swarm_id, self.tenant):
            if isinstance(ev, Delta):
                out = frames.delta(ev.name, ev.text)
            elif ev.data.get("kind") != "worker":
                continue
            elif ev.type == "subtask.succeeded":
                name = str(ev.data.get("name"))
                out = frames.end(name, await self._output(swarm_id, name) or "")
            elif ev.type in ("subtask.failed", "subtask.skipped"):
                out = frames.end(str(ev.data.get("name")), None)
            else:
                continue
            for text in out:
                yield text
        for text in frames.finish():
            yield text

    async def _output(self, swarm_id: str, name: str) -> str | None:
        async with self.sessions() as s, s.begin():
            return await queries.subtask_output(s, swarm_id, name)
