"""`POST /swarms/{id}/approve` and `POST /swarms/{id}/reject` (SPEC §14): the decision on a
swarm held for approval."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from app.api.admission import AdmissionInInsertDep
from app.api.deps import EngineDep, KeyFirstRoute, NotifierDep, SessionDep, TenantDep
from app.api.errors import error_responses
from app.api.shared import check_id, read_swarm, swarm_answer, swarm_or_404
from app.config import Settings
from app.db import audit
from app.db.session import db_now
from app.db.tables import Swarm
from app.engine import gate
from app.engine.specs import NewSwarm, build_swarm
from app.schemas import SwarmApprove, SwarmCreate, SwarmRead, SwarmReject
from app.webhook_policy import check_webhook_url

log = logging.getLogger(__name__)
router = APIRouter(prefix="/swarms", tags=["swarms"], route_class=KeyFirstRoute)


def _edited(swarm: Swarm, body: SwarmApprove, request: Request, tenant: str,
            admission: AdmissionInInsertDep) -> NewSwarm:
    """The swarm's request with the reviewer's agents and limits, validated as a request
    (a 422 names the field as `POST /swarms` would) and laid out."""
    settings: Settings = request.app.state.settings
    spec: dict[str, Any] = {**swarm.spec, "task": swarm.task}
    if body.agents is not None:
        spec["agents"] = [a.model_dump(exclude_unset=True) for a in body.agents]
    if body.limits is not None:
        spec["limits"] = {**spec["limits"],
                          **body.limits.model_dump(mode="json", exclude_unset=True)}
    try:
        request_body = SwarmCreate.model_validate(spec)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    request_body = admission.swarm(request_body)  # the tenant's max_agents, max_budget_usd
    return build_swarm(request_body, settings, tenant, tools=request.app.state.tools)


@router.post(
    "/{swarm_id}/approve", status_code=202, response_model=SwarmRead,
    responses=error_responses(400, 401, 404, 409, 413, 415, 422),
    summary="Approve a swarm awaiting approval (optionally with an edited plan)",
)
async def approve_swarm(swarm_id: str, request: Request, session: SessionDep,
                        tenant: TenantDep, engine: EngineDep, notifier: NotifierDep,
                        admission: AdmissionInInsertDep,
                        body: SwarmApprove | None = None) -> Response:
    """The swarm runs. With `agents`, exactly that plan runs instead of the one shown (the
    planner's work stays); `limits` override the swarm's key by key. A swarm that is not
    awaiting approval → 409 `not_awaiting_approval`."""
    check_id(swarm_id)
    edits = body is not None and (body.agents is not None or body.limits is not None)
    async with session.begin():
        swarm = await swarm_or_404(session, swarm_id, tenant, for_update=True)
        gate.check_awaiting(swarm)
        edited = _edited(swarm, body, request, tenant, admission) if edits and body else None
        url = swarm.spec.get("webhook_url")
        if edited is not None and isinstance(url, str):  # today's webhook policy holds
            await check_webhook_url(url, request.app.state.settings, tenant)
        await gate.approve(session, swarm, edited, request.app.state.settings,
                           request.app.state.tools, await db_now(session))
        audit.record(session, "approve", swarm_id)
    log.info("swarm %s approved%s", swarm_id, " with an edited plan" if edits else "",
             extra={"swarm_id": swarm_id})
    notifier.notify(swarm_id)
    if engine is not None:
        engine.wake()
    return swarm_answer(await read_swarm(session, swarm_id, tenant), 202)


@router.post(
    "/{swarm_id}/reject", status_code=202, response_model=SwarmRead,
    responses=error_responses(400, 401, 404, 409, 413, 415, 422),
    summary="Reject a swarm awaiting approval",
)
async def reject_swarm(swarm_id: str, session: SessionDep, tenant: TenantDep,
                       notifier: NotifierDep, body: SwarmReject | None = None) -> Response:
    """The swarm ends `cancelled` with `error.code = "rejected"` (and the reason given); a
    swarm that is not awaiting approval → 409 `not_awaiting_approval`."""
    check_id(swarm_id)
    async with session.begin():
        swarm = await swarm_or_404(session, swarm_id, tenant, for_update=True)
        await gate.reject(session, swarm, body.reason if body else None,
                          await db_now(session))
        audit.record(session, "reject", swarm_id)
    log.info("swarm %s rejected", swarm_id, extra={"swarm_id": swarm_id})
    notifier.notify(swarm_id)
    return swarm_answer(await read_swarm(session, swarm_id, tenant), 202)
