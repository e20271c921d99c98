"""What the routes that create or read swarms share: the id check, reading one swarm, and the
Idempotency-Key flow (replay a live key, else insert once) of `POST /swarms` and its retry."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Header, Response
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import create, queries, retry_copy
from app.db.tables import Swarm
from app.errors import IdempotencyKeyReused, SwarmNotFound
from app.states import SwarmStatus
from app.views import swarm_json

IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[^\x00-\x1f\x7f]+$",
           description="Same key + same body returns the same swarm (kept at least 24 h)"),
]
# Not validated here: a malformed traceparent is ignored (W3C), never refused
TraceParent = Annotated[
    str | None,
    Header(description="W3C trace context: the swarm's trace continues the caller's"),
]


def check_id(swarm_id: str) -> None:
    """Ids are UUIDs: anything else is unknown without asking the database (which may reject
    it, e.g. PostgreSQL on a NUL byte)."""
    try:
        uuid.UUID(swarm_id)
    except ValueError:
        raise SwarmNotFound.of(swarm_id) from None


async def status_or_404(session: AsyncSession, swarm_id: str, tenant: str) -> SwarmStatus:
    """The tenant's swarm's status, read in a transaction of its own (cheap: one column),
    else 404."""
    check_id(swarm_id)
    async with session.begin():
        status = await queries.get_status(session, swarm_id, tenant)
    if status is None:
        raise SwarmNotFound.of(swarm_id)
    return status


async def swarm_or_404(session: AsyncSession, swarm_id: str, tenant: str, *,
                       for_update: bool = False) -> Swarm:
    """The tenant's swarm (in the caller's transaction, its row locked `for_update`), else
    404."""
    swarm = await queries.get_swarm(session, swarm_id, tenant, for_update=for_update)
    if swarm is None:
        raise SwarmNotFound.of(swarm_id)
    return swarm


def swarm_answer(view: bytes, status_code: int = 200, response: Response | None = None
                 ) -> Response:
    """A swarm's view (`views.swarm_json`, serialized as SwarmRead) as a route's answer, with
    the headers the route set on its `response` (FastAPI adds those only to answers it
    serializes itself)."""
    answer = Response(view, status_code, media_type="application/json")
    if response is not None:
        answer.headers.raw.extend(h for h in response.headers.raw
                                  if h[0] not in (b"content-length", b"content-type"))
    return answer


async def read_swarm(session: AsyncSession, swarm_id: str, tenant: str) -> bytes:
    """The swarm with its subtasks, as JSON (404 when unknown to this tenant)."""
    check_id(swarm_id)
    async with session.begin():
        swarm = await swarm_or_404(session, swarm_id, tenant)
        subs = (await queries.subtask_views(session, [swarm.id]))[swarm.id]
        position = (await queries.queue_position(session, swarm)
                    if swarm.status == SwarmStatus.queued else None)
        retried_by = (await retry_copy.retried_by(session, [swarm.id])).get(swarm.id)
    return swarm_json(swarm, subs, queue_position=position, retried_by=retried_by)


async def replay(session: AsyncSession, response: Response, tenant: str, key: str,
                 digest: str, ttl_s: float) -> bytes | None:
    """The swarm a live Idempotency-Key names (only for the same request), or None: key free."""
    holder = await create.key_holder(session, tenant, key, ttl_s)
    if holder is None:
        return None
    holder_id, holder_hash = holder
    if holder_hash != digest:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was used with a different request body",
            details={"field": "Idempotency-Key", "swarm_id": holder_id})
    response.headers["Location"] = f"/swarms/{holder_id}"
    return await read_swarm(session, holder_id, tenant)


async def insert_once(session: AsyncSession, response: Response, tenant: str, key: str | None,
                      digest: str, ttl_s: float,
                      insert: Callable[[AsyncSession], Awaitable[None]],
                      admit: Callable[[AsyncSession], Awaitable[None]] | None = None
                      ) -> bytes | None:
    """Run `admit` (the tenant's quota checks), then `insert` (which stores a swarm carrying
    `key` and `digest`) in one transaction, unless a live `key` already names a swarm: then
    answer with that swarm (same request) or 422 (another request). None when this call
    inserted. The order is every creation's lock order (`creation_statement._creation`): the
    tenant's lock, then the key's old holder, then the new rows."""
    if key is not None and (seen := await replay(session, response, tenant, key, digest, ttl_s)):
        return seen
    try:
        async with session.begin():
            if admit is not None:
                await admit(session)
            if key is not None:
                await create.expire_idempotency_key(session, tenant, key, ttl_s)
            await insert(session)
    except IntegrityError:
        # a concurrent request with the same key won the insert: answer with its swarm
        if key is None or not (seen := await replay(session, response, tenant, key, digest,
                                                    ttl_s)):
            raise
        return seen
    return None
