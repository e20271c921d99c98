"""Operational routes: liveness, readiness, metrics."""

from __future__ import annotations

import asyncio
import math

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from app import metrics
from app.api.deps import SettingsDep, tenant_of
from app.api.errors import error_response, error_responses
from app.config import Settings
from app.db.migrate import current_revision, head_revision
from app.db.queries import oldest_queued_at
from app.db.types import utcnow
from app.errors import Unauthorized
from app.schemas import Health, Ready

router = APIRouter(tags=["operations"])
QUEUE_MEASURE_S = 1.0


@router.get("/healthz", response_model=Health, summary="The process is up")
async def check_health() -> Health:
    return Health(status="ok")


def _authenticated(request: Request, settings: Settings) -> bool:
    """Whether the caller may read what names the deployment: auth is off, or its key is
    valid (a wrong key is no error here: the route needs none)."""
    try:
        tenant_of(settings, request.headers.get("authorization"))
    except Unauthorized:
        return False
    return True


@router.get("/readyz", response_model=Ready, response_model_exclude_none=True,
            responses=error_responses(503),
            summary="The database is reachable and migrated (details with a valid key)")
async def check_ready(request: Request, settings: SettingsDep) -> Response:
    """Ready or not to anyone; the tool servers and the versions (schema, price table,
    tenants file) only to a caller with a valid key (or with auth off), and in /metrics."""
    engine = request.app.state.db_engine
    known = _authenticated(request, settings)
    try:
        revision = await current_revision(engine)
    except Exception as exc:
        return error_response(503, "unavailable", f"database unreachable: {type(exc).__name__}"
                              if known else "not ready")
    head = head_revision(settings.migrations_dir)
    if revision != head:
        if not known:
            return error_response(503, "unavailable", "not ready")
        return error_response(503, "unavailable", "database not migrated",
                              {"revision": revision, "head": head})
    if not known:
        return JSONResponse({"status": "ok"})
    tools = request.app.state.tools
    return JSONResponse(Ready(status="ok", database="ok", revision=revision,
                              price_table_version=settings.prices.version,
                              tool_servers={} if tools is None else tools.states(),
                              tenants_version=settings.tenants.version).model_dump())


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition"}})
async def get_metrics(request: Request) -> Response:
    await _measure_queue(request)
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)


async def _measure_queue(request: Request) -> None:
    """swarm_queue_oldest_age_seconds from the database, now; NaN (no figure) while the
    database does not answer within a second: a scrape is never held by an outage, which
    the readiness probe reports."""
    sessions = getattr(request.app.state, "sessions", None)
    if sessions is None:  # the lifespan has not opened the database
        return
    try:
        async with asyncio.timeout(QUEUE_MEASURE_S), sessions() as session:
            oldest = await oldest_queued_at(session)
    except Exception:
        metrics.set_queue_oldest_age(math.nan)
        return
    age = 0.0 if oldest is None else (utcnow() - oldest).total_seconds()
    metrics.set_queue_oldest_age(max(age, 0.0))
