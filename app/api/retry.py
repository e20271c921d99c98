"""`POST /swarms/{id}/retry` (SPEC §11): a new swarm that reuses what the old one finished."""

from __future__ import annotations

import logging
from collections import Counter

from fastapi import APIRouter, Response
from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics, tracing
from app.api.admission import AdmissionInInsertDep
from app.api.deps import EngineDep, KeyFirstRoute, SessionDep, SettingsDep, TenantDep
from app.api.errors import error_responses
from app.api.shared import (
    IdempotencyKey,
    TraceParent,
    check_id,
    insert_once,
    read_swarm,
    swarm_answer,
    swarm_or_404,
)
from app.db import audit, retry_copy
from app.db.tables import Swarm
from app.engine.specs import check_model, check_tenant_tools, retry_digest, retry_row
from app.errors import NotRetryable
from app.schemas import SwarmRead, SwarmRetry
from app.states import SwarmStatus
from app.webhook_policy import check_webhook_url

log = logging.getLogger(__name__)
router = APIRouter(prefix="/swarms", tags=["swarms"], route_class=KeyFirstRoute)
RETRYABLE = (SwarmStatus.failed, SwarmStatus.cancelled)


@router.post(
    "/{swarm_id}/retry", status_code=202, response_model=SwarmRead,
    responses=error_responses(400, 401, 404, 409, 413, 415, 422, 429),
    summary="Retry a failed or cancelled swarm",
)
async def retry_swarm(swarm_id: str, response: Response, session: SessionDep, tenant: TenantDep,
                      settings: SettingsDep, engine: EngineDep,
                      admission: AdmissionInInsertDep,
                      body: SwarmRetry | None = None,
                      idempotency_key: IdempotencyKey = None,
                      traceparent: TraceParent = None) -> Response:
    """A new swarm (`retry_of` = this one): subtasks that succeeded here are copied with their
    outputs (`reused`, no call, no cost); the others and the synthesis run again. `limits`
    override the old run's limits key by key. The old swarm is not changed. The tenant's
    quotas are checked in the insert's transaction, after a replayed
    Idempotency-Key is answered."""
    check_id(swarm_id)
    limits = (body.limits.model_dump(mode="json", exclude_unset=True)
              if body is not None and body.limits is not None else {})
    admission.check_budget(limits.get("budget_usd"))  # a new swarm: the tenant's quotas hold
    async with session.begin():
        url = (await swarm_or_404(session, swarm_id, tenant)).spec.get("webhook_url")
    if isinstance(url, str):  # the webhook policy in force now holds, as for a new swarm
        await check_webhook_url(url, settings, tenant)
    digest = retry_digest(swarm_id, limits)
    created: list[str] = []
    reused: list[retry_copy.Reused] = []

    olds: list[Swarm] = []

    async def admit(s: AsyncSession) -> None:
        old = await swarm_or_404(s, swarm_id, tenant)
        if old.status not in RETRYABLE:
            raise NotRetryable(
                f"only failed or cancelled swarms can be retried; this one is {old.status}",
                details={"status": old.status})
        for model in await retry_copy.rerun_models(s, old.id):
            check_model(settings, model, "model")  # the price table may have changed since
        check_tenant_tools(old.spec, settings.tenant_limits(tenant).tools)  # and its tools
        olds[:] = [old]
        # before any row, as every creation (insert_once): a refusal rolls back the token
        await admission.check_in(s)

    async def insert(s: AsyncSession) -> None:
        old = olds[0]
        new = retry_row(old, limits, settings, idempotency_key,
                        digest if idempotency_key else None)
        # a trace of its own
        new.trace_parent = tracing.swarm_created(traceparent, audit.key_id())
        reused[:] = await retry_copy.copy_swarm(s, old.id, new)
        audit.record(s, "retry", new.id)
        created[:] = [new.id]

    if seen := await insert_once(session, response, tenant, idempotency_key, digest,
                                 settings.idempotency_ttl_s, insert, admit):
        return swarm_answer(seen, 202, response)
    for kind, n in Counter(r.kind for r in reused).items():
        metrics.subtasks_reused.labels(kind).inc(n)
    if engine is not None:
        engine.wake()
    response.headers["Location"] = f"/swarms/{created[0]}"
    answer = await read_swarm(session, created[0], tenant)
    log.info("swarm %s created, a retry of %s (%d subtasks reused)", created[0], swarm_id,
             len(reused), extra={"swarm_id": created[0], "retry_of": swarm_id})
    return swarm_answer(answer, 202, response)
