"""Routes of /swarms: create, read (with ?wait=), list, cancel, events."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter
from sqlalchemy.ext.asyncio import AsyncSession
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask

from app import logs, metrics, tracing
from app.aio import alongside
from app.api.admission import AdmissionInInsertDep, StreamGateDep, WaitSlotDep, admit_in_insert
from app.api.deps import (
    EngineDep,
    NotifierDep,
    SessionDep,
    TenantDep,
    authenticate,
    route_path,
)
from app.api.errors import error_responses
from app.api.follow import FALLBACK_S, follow_events, follow_with_deltas
from app.api.request_parser import header, json_body, parsed_route
from app.api.shared import IdempotencyKey, TraceParent, insert_once, replay
from app.api.shared import check_id as _check_id
from app.api.shared import read_swarm as _read
from app.api.shared import status_or_404 as _status_or_404
from app.api.shared import swarm_answer as _answer
from app.api.shared import swarm_or_404 as _swarm_or_404
from app.api.sse import (
    EVENT_STREAM_RESPONSE,
    LAST_EVENT_ID_DOC,
    LAST_EVENT_ID_PATTERN,
    resume_after,
)
from app.config import Settings
from app.db import audit, create, erase, queries, quotas, retry_copy
from app.db.dialect import dialect_of
from app.db.session import SessionFactory, db_now
from app.db.tables import Subtask, Swarm
from app.db.types import utcnow
from app.engine import finish, gate
from app.engine.deltas import Delta
from app.engine.scheduler import Scheduler
from app.engine.specs import NewSwarm, build_swarm
from app.errors import AlreadyTerminal, NotTerminal, RequestInvalid
from app.schemas import SwarmCreate, SwarmList, SwarmRead
from app.states import SwarmStatus
from app.tools.registry import ToolRegistry
from app.views import swarm_fields, swarm_json, to_json
from app.webhook_policy import check_webhook_url

log = logging.getLogger(__name__)

router = APIRouter(prefix="/swarms", tags=["swarms"])

def _links(*targets: tuple[str, str, str]) -> dict[str, Any]:
    """OpenAPI links from a swarm answer to what a client does next with its id (schema-aware
    clients and schemathesis' stateful phase follow them)."""
    return {name: {"operationRef": f"#/paths/~1swarms~1{{swarm_id}}{tail}/{method}",
                   "parameters": {"swarm_id": "$response.body#/id"}}
            for name, method, tail in targets}


SWARM_LINKS = _links(("GetSwarm", "get", ""), ("CancelSwarm", "post", "~1cancel"),
                     ("StreamSwarmEvents", "get", "~1events"))


# Routed below with `_create_arguments` as its parser: this signature documents the request
# (OpenAPI) and says what FastAPI would pass; tests/perf/test_request_parser.py holds the two to it.
async def create_swarm(body: SwarmCreate, request: Request, response: Response,
                       tenant: TenantDep, admission: AdmissionInInsertDep,
                       idempotency_key: IdempotencyKey = None,
                       traceparent: TraceParent = None) -> Response:
    """Validate, store the swarm and its subtasks in one transaction, and queue it."""
    state = request.app.state
    settings: Settings = state.settings
    engine: Scheduler | None = state.engine
    tools: ToolRegistry | None = state.tools
    body = admission.swarm(body)  # the tenant's quotas on agents and budget (SPEC §8)
    new = build_swarm(body, settings, tenant, idempotency_key, tools=tools)
    new.swarm.trace_parent = tracing.swarm_created(traceparent, audit.key_id())
    if body.webhook_url is not None:
        await check_webhook_url(body.webhook_url, settings, tenant)
    now = utcnow()
    # named agents whose estimate needs approval: stored awaiting it, for no engine to claim
    held = await gate.hold_at_creation(state.sessions, new, settings, tools, now)
    local = _claimer(engine) if held is None else None
    # claimed as it is created: its runner now, its first calls written ahead with it
    runner = local.adoption(new.swarm, new.subtasks) if local is not None else None
    ahead = runner.first_wave() if runner is not None else None
    action: audit.Action = "chat" if route_path(request).startswith("/v1/") else "create"
    position: int | None = None
    fields: dict[str, Any] | None = None  # the answer's, built while it is inserted

    async def admit(s: AsyncSession) -> None:
        await admission.check_in(s)  # first: a refusal rolls it all back

    async def insert(s: AsyncSession) -> None:
        # one transaction: the tenant's quotas, then the rows, the NOTIFY, the local claim and
        # the queue position; the answer is built from what it inserted, nothing is read back
        nonlocal position
        position = await create.insert_swarm(
            s, new.swarm, new.subtasks, claim_for=local.owner if local else None,
            lease_s=settings.lease_seconds, position=held is None, ahead=ahead)
        await gate.write_held(s, new.swarm, held, now)  # a held swarm's event and webhook
        audit.record(s, action, new.swarm.id)

    if (admission.in_statement and held is None
            and dialect_of(settings.database_url).admits_in_the_insert):
        # PostgreSQL: the insert is one statement, a transaction of its own, that checks the
        # tenant's quotas and frees an expired holder of the Idempotency-Key first (the typed
        # client sends a key with every creation: it was eleven round trips). A live holder is
        # found only when the statement fails: the key's unique constraint, or a quota — a
        # replay is answered whatever the quotas say
        digest, ttl = new.swarm.request_hash or "", settings.idempotency_ttl_s
        try:
            position, fields = await _inserted(create.insert_swarm_alone(
                state.db_engine, new.swarm, new.subtasks,
                claim_for=local.owner if local else None, lease_s=settings.lease_seconds,
                position=True, admit=admission.statement_checks(),
                key_ttl_s=None if idempotency_key is None else ttl, ahead=ahead,
                audit=audit.statement_values(action)), new)
        except quotas.Refused as refused:
            if idempotency_key is not None and (seen := await _replayed(
                    state.sessions, response, tenant, idempotency_key, digest, ttl)):
                return _answer(seen, 202, response)
            raise admission.refusal(refused) from None
        except create.KeyTaken:
            # the key's live holder (an earlier request, or a concurrent one that won)
            assert idempotency_key is not None
            if not (seen := await _replayed(state.sessions, response, tenant, idempotency_key,
                                            digest, ttl)):
                raise
            return _answer(seen, 202, response)
    else:
        async with state.sessions() as session:
            # the body's hash only matters with a key (build_swarm made it then): for a
            # 1,000-agent body its canonical JSON costs milliseconds
            if seen := await insert_once(session, response, tenant, idempotency_key,
                                         new.swarm.request_hash or "",
                                         settings.idempotency_ttl_s, insert, admit):
                return _answer(seen, 202, response)
    response.headers["Location"] = f"/swarms/{new.swarm.id}"
    log.info("swarm %s created: %d subtasks, budget %s USD", new.swarm.id, len(new.subtasks),
             new.swarm.budget_usd, extra={
                 "swarm_id": new.swarm.id, "trace_id": logs.trace_id_of(new.swarm.trace_parent),
                 "subtasks": len(new.subtasks), "queue_position": position})
    view = (swarm_json(new.swarm, queries.rows_of(new.subtasks), queue_position=position)
            if fields is None else to_json({**fields, "queue_position": position}))
    if local is not None and runner is not None:  # this process runs it: no wake-up, no reload
        # after the view: the runner mutates rows
        local.adopt(runner)
    elif engine is not None:
        engine.wake()
    return _answer(view, 202, response)


def _claimer(engine: Scheduler | None) -> Scheduler | None:
    """This process's engine when it has room to claim a new swarm as it creates it."""
    return engine if engine is not None and engine.has_capacity() else None


async def _inserted(insert: Coroutine[Any, Any, int | None], new: NewSwarm
                   ) -> tuple[int | None, dict[str, Any] | None]:
    """The creation's statement awaited (its queue position); for a wide swarm (`_WIDE`) its
    answer's fields, all but that position, built while the statement runs (`aio.alongside`:
    its task's first step builds and sends it) instead of after it, off the answer's
    latency."""
    if len(new.subtasks) < _WIDE:
        return await insert, None
    return await alongside(insert, lambda: swarm_fields(new.swarm,
                                                        queries.rows_of(new.subtasks)))


async def _replayed(sessions: SessionFactory, response: Response, tenant: str, key: str,
                    digest: str, ttl_s: float) -> bytes | None:
    """`replay` in a session of its own (the creation's statement used none)."""
    async with sessions() as session:
        return await replay(session, response, tenant, key, digest, ttl_s)


# from this many subtasks a creation's answer is built while its statement runs: below, its
# fields cost less than the task and the loop turn that overlap takes (~2.5 us a subtask)
_WIDE = 16
_BODY = TypeAdapter(SwarmCreate)
_KEY = TypeAdapter(IdempotencyKey)


async def _create_arguments(request: Request) -> dict[str, Any]:
    """`create_swarm`'s arguments as FastAPI would solve them from its signature, in the same
    order (the tenant, 401 first; then the headers' and the body's errors, in one 422)."""
    settings: Settings = request.app.state.settings
    tenant = authenticate(request)
    errors: list[dict[str, Any]] = []
    key = header(request, "Idempotency-Key", _KEY, errors)
    body = await json_body(request, _BODY, errors)
    if errors or body is None:
        raise RequestValidationError(errors)
    return {"body": body, "request": request, "response": Response(), "tenant": tenant,
            "admission": await admit_in_insert(tenant, settings), "idempotency_key": key,
            "traceparent": request.headers.get("traceparent")}


router.add_api_route(
    "", create_swarm, methods=["POST"], status_code=202, response_model=SwarmRead,
    responses={202: {"links": SWARM_LINKS}, **error_responses(400, 401, 413, 415, 422, 429)},
    summary="Start a swarm", route_class_override=parsed_route(_create_arguments),
)


@router.get("", response_model=SwarmList, responses=error_responses(400, 401, 422),
            summary="List swarms, newest first")
async def list_swarms(
    session: SessionDep, tenant: TenantDep,
    status: Annotated[SwarmStatus | None, Query(description="only swarms in this status")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
    retry_of: Annotated[uuid.UUID | None, Query(description="only the retries of this swarm "
                                                "(POST /swarms/{id}/retry)")] = None,
) -> Response:
    """Tenant-scoped, keyset-paged; items omit subtask outputs and results."""
    async with session.begin():
        try:
            rows, next_cursor = await queries.list_swarms(
                session, tenant, status.value if status else None, limit, cursor,
                retry_of=str(retry_of) if retry_of else None)
        except ValueError as exc:
            raise RequestInvalid(str(exc), code="invalid_cursor",
                                 details={"field": "cursor"}) from exc
        ids = [s.id for s in rows]
        subs = await queries.subtask_views(session, ids, outputs=False)
        retried_by = await retry_copy.retried_by(session, ids)
        positions = await queries.queue_positions(session, rows, contiguous=retry_of is None)
    return _answer(to_json({  # SwarmList's fields
        "items": [swarm_fields(s, subs[s.id], with_outputs=False,
                               retried_by=retried_by.get(s.id),
                               queue_position=positions.get(s.id)) for s in rows],
        "next_cursor": next_cursor}))


@router.get("/{swarm_id}", response_model=SwarmRead,
            responses=error_responses(401, 404, 422, 429),
            summary="Read a swarm (optionally wait for it to finish)")
async def get_swarm(
    swarm_id: str, session: SessionDep, tenant: TenantDep, notifier: NotifierDep,
    _stream: WaitSlotDep,
    wait: Annotated[float | None, Query(ge=0, le=60, description="hold up to S seconds until "
                                        "the swarm is terminal")] = None,
) -> Response:
    """The swarm with its subtasks, progress, usage and timing."""
    if not wait:
        return _answer(await _read(session, swarm_id, tenant))
    # Waiting looks only at the status; the view (every subtask: a 1,000-agent swarm's is
    # ~1 MB of rows) is read once, when it is answered.
    async def status() -> SwarmStatus:  # 404 for a swarm not (or no longer) there
        return await _status_or_404(session, swarm_id, tenant)

    ended = await notifier.until_ended(swarm_id, time.monotonic() + wait, status, FALLBACK_S)
    if ended.answer is not None:  # its runner built it from the rows it committed
        return _answer(ended.answer)
    if ended.rows is not None:  # it ended here: its runner's rows are what was committed
        return _answer(ended_answer(*ended.rows))
    return _answer(await _read(session, swarm_id, tenant))


def ended_answer(swarm: Swarm, subtasks: Iterable[Subtask]) -> bytes:
    """A swarm that ended in this process, answered from its runner's rows (what its end
    committed; it cannot have been retried yet): `SwarmNotifier.renderer`."""
    return swarm_json(swarm, queries.rows_of(sorted(subtasks, key=lambda s: s.position)))


@router.post("/{swarm_id}/cancel", status_code=202, response_model=SwarmRead,
             responses=error_responses(401, 404, 409, 413, 415, 422),
             summary="Cancel a swarm")
async def cancel_swarm(swarm_id: str, session: SessionDep, tenant: TenantDep,
                       engine: EngineDep, notifier: NotifierDep) -> Response:
    """Stops launching, cancels in-flight calls within a second; finished outputs stay."""
    _check_id(swarm_id)
    async with session.begin():
        swarm = await _swarm_or_404(session, swarm_id, tenant, for_update=True)
        if swarm.status.terminal:
            raise AlreadyTerminal(f"swarm is already {swarm.status}",
                                  details={"status": swarm.status})
        cancelled_here = await finish.cancel(session, swarm)
        audit.record(session, "cancel", swarm_id)
    if cancelled_here:  # committed (the session's rows are not expired by it)
        finish.log_end(swarm, SwarmStatus.cancelled, (
            (swarm.finished_at or swarm.created_at) - swarm.created_at).total_seconds(), None)
        notifier.notify(swarm_id)
    elif engine is not None:
        engine.cancel_local(swarm_id)
    return _answer(await _read(session, swarm_id, tenant), 202)


@router.delete("/{swarm_id}", status_code=204, response_class=Response,
               responses=error_responses(401, 404, 409, 422),
               summary="Erase a swarm's content")
async def delete_swarm(swarm_id: str, session: SessionDep, tenant: TenantDep) -> Response:
    """Removes the content of a terminal swarm for good (task, metadata, spec, prompts,
    outputs, transcripts, event payloads, result) and drops its pending webhook; its id,
    status, timestamps, usage and ledger rows stay, so spend reports and daily caps do not
    change. It then reads `"erased": true`. A swarm still running → 409 `not_terminal`;
    erasing an erased swarm again answers 204."""
    _check_id(swarm_id)
    async with session.begin():
        swarm = await _swarm_or_404(session, swarm_id, tenant, for_update=True)
        if not swarm.status.terminal:
            raise NotTerminal(f"only an ended swarm can be erased; this one is {swarm.status}",
                              details={"status": swarm.status})
        erased = await erase.erase_swarm(session, swarm, await db_now(session))
        if erased:  # a change: audited with it (a repeated erase changes nothing)
            audit.record(session, "erase", swarm_id)
    if erased:
        metrics.erased_swarms.labels("request").inc()
        log.info("swarm %s erased", swarm_id, extra={"swarm_id": swarm_id, "tenant": tenant})
    return Response(status_code=204)


DELTAS_DOC = ("true: also the workers' tokens as they come (`subtask.delta`, no `id:`), for a "
              "swarm created with `limits.stream_tokens`")


@router.get("/{swarm_id}/events", response_class=EventSourceResponse, responses={
    200: EVENT_STREAM_RESPONSE, **error_responses(400, 401, 404, 422, 429)},
    summary="Stream a swarm's events")
async def stream_swarm_events(
    swarm_id: str, request: Request, session: SessionDep, tenant: TenantDep,
    notifier: NotifierDep, gate: StreamGateDep,
    last_event_id: Annotated[str | None, Header(
        alias="Last-Event-ID", description=LAST_EVENT_ID_DOC,
        # documented, not enforced by FastAPI: resume_after answers 400 invalid_last_event_id
        json_schema_extra={"pattern": LAST_EVENT_ID_PATTERN})] = None,
    deltas: Annotated[bool, Query(description=DELTAS_DOC)] = False,
) -> EventSourceResponse:
    """`id:` is the per-swarm sequence number; `Last-Event-ID` resumes after it; the stream
    ends after `swarm.completed`. With `?deltas=true`, a swarm created with
    `limits.stream_tokens` also sends its workers' text as it comes: `subtask.delta` events
    `{name, text}` without `id:` (not stored, not resumed)."""
    after = resume_after(last_event_id)
    await _status_or_404(session, swarm_id, tenant)
    sessions = request.app.state.sessions
    slot = gate.take()  # one of the tenant's max_streams, until the stream ends

    async def stream() -> AsyncIterator[dict[str, Any]]:
        try:
            follow = follow_with_deltas if deltas else follow_events
            async for ev in follow(sessions, notifier, swarm_id, tenant, after):
                if isinstance(ev, Delta):
                    yield {"event": "subtask.delta",
                           "data": json.dumps({"swarm_id": swarm_id, "name": ev.name,
                                               "text": ev.text})}
                    continue
                yield {"id": str(ev.seq), "event": ev.type,
                       "data": json.dumps({"seq": ev.seq, "swarm_id": swarm_id, **ev.data},
                                          default=str)}
        finally:
            slot.release()

    # the slot is freed when the stream ends, or after the response if it never started
    settings: Settings = request.app.state.settings
    return EventSourceResponse(stream(), ping=settings.sse_ping_s,
                               background=BackgroundTask(slot.release))
