"""The OpenAI-compatible facade (SPEC §10): `POST /v1/chat/completions` and `GET /v1/models`,
so code written for the OpenAI SDK runs swarms with only `base_url` and `api_key` changed."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response

from app.api.admission import RateLimitDep
from app.api.deps import SettingsDep, TenantDep
from app.api.openai_errors import OpenAIRoute, openai_responses
from app.api.openai_passthrough import Passthrough
from app.api.openai_slots import CLIENT_GONE, ClientGone, stream_slot, unless_gone
from app.api.openai_swarm import SwarmCall
from app.api.sse import json_event_schema
from app.db import audit
from app.openai_schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionCreate,
    ModelCard,
    ModelList,
    inline_schema,
)

router = APIRouter(prefix="/v1", tags=["openai"], route_class=OpenAIRoute)

IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[^\x00-\x1f\x7f]+$",
           description="with agent_swarm: the same key + body answers from the same swarm"),
]

_STREAM_DOC = (
    "`stream: true`: `chat.completion.chunk` events (`data: {...}`), ending with "
    "`data: [DONE]`; an error after the stream began arrives as `data: {\"error\": {...}}`.")


@router.get("/models", response_model=ModelList, responses=openai_responses(401, 422),
            summary="List the priced models", operation_id="listModels")
async def list_models(settings: SettingsDep, tenant: TenantDep) -> ModelList:
    """Every model of the price table (what `model` may name), in OpenAI's list shape."""
    return ModelList(data=[ModelCard(id=name) for name in settings.prices.names()])


@router.post(
    "/chat/completions", response_model=ChatCompletion,
    responses={200: {"description": "A `chat.completion`, or with `stream: true` an event "
                                    "stream. " + _STREAM_DOC,
                     "content": {"text/event-stream": {"schema": json_event_schema(
                         inline_schema(ChatCompletionChunk), done_marker="[DONE]")}}},
               202: {"model": ChatCompletion,
                     "description": "`agent_swarm.approval`: the swarm is held for approval; "
                                    "an empty `chat.completion` with `swarm_id` and "
                                    "`swarm_status: awaiting_approval`"},
               **openai_responses(400, 401, 409, 413, 415, 422, 429, 502, 503)},
    summary="Create a chat completion (or, with agent_swarm, run a swarm)",
    operation_id="createChatCompletion",
)
async def create_chat_completion(
    body: ChatCompletionCreate, request: Request, tenant: TenantDep,
    admission: RateLimitDep, idempotency_key: IdempotencyKey = None,
) -> Response | ChatCompletion:
    """With `agent_swarm.enabled`: runs a swarm and answers with its result, the
    summed usage of all its gateway calls and `swarm_id`; the request waits for the swarm (up
    to its deadline), and a client that goes away leaves it running. Without: the request goes
    to the gateway unchanged, metered in the ledger (`/usage`), the metrics and the daily cap.
    """
    if body.agent_swarm is not None and body.agent_swarm.enabled:
        call = SwarmCall(request, body, tenant)
        # SPEC §10: streamed or waited for, it holds one of the tenant's max_streams (429 at
        # once), taken before the swarm is created, given back when the stream ends or the
        # waiting caller gets its answer or leaves
        held = stream_slot(request, tenant)
        streams = False
        try:
            swarm_id = await call.create(request, idempotency_key, admission)
            if (parked := await unless_gone(request, call.held(swarm_id))) is not None:
                return parked  # held for approval (SPEC §14)
            if body.stream:
                streams = True
                return call.stream(swarm_id, held.release)
            return await unless_gone(request, call.answer(swarm_id))
        except ClientGone:  # the swarm runs on (SPEC §10); nobody reads this
            return Response(status_code=CLIENT_GONE)
        finally:
            if not streams:
                held.release()
    raw: dict[str, Any] = json.loads(await request.body())
    forward = Passthrough(request, body, tenant, raw)
    # a row of its own, before the gateway is asked: a call that fails was still made
    await audit.record_alone(request.app.state.sessions, "passthrough")
    return await forward.stream() if body.stream else await forward.complete()
