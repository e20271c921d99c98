"""Annotated dependencies: settings, a session, the caller's tenant, the engine hooks."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Header, Request, Response, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession

from app import logs, tracing
from app.config import Settings
from app.db import audit
from app.engine.scheduler import Scheduler
from app.engine.waiters import SwarmNotifier
from app.errors import Forbidden, Unauthorized
from app.keys import ApiKey, now_utc
from app.tools.registry import ToolRegistry

DEFAULT_TENANT = "default"


# Every dependency is `async def`, even those that only read app.state: FastAPI runs a plain
# `def` dependency in its thread pool, a thread hop (and a wait for a free thread under load)
# per dependency per request


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as session:
        yield session


# the OpenAPI document's security scheme, on every route that resolves the tenant; it never
# refuses (auto_error=False): tenant_of checks the key and answers 401 in the API's shape
BEARER = HTTPBearer(scheme_name="bearer", auto_error=False,
                    description="A key of SWARM_API_KEYS or of the tenants file, which names "
                                "the caller's tenant and may be limited to scopes (needed "
                                "when any key is configured)")


async def get_tenant(
    request: Request,
    _documented: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> str:
    """The caller's tenant from `Authorization: Bearer <key>`, its key holding the scope of the
    route's family; everyone is one tenant when no key is configured."""
    return authenticate(request)


def scope_of(method: str, path: str) -> str:
    """The scope a route's family needs (SPEC §16): the facade `chat`, `/usage` and `/audit`
    their own, every other read `swarms:read` and every other change `swarms:write` (a route
    added later is in its family without a word)."""
    if path.startswith("/v1/"):
        return "chat"
    if path == "/usage":
        return "usage:read"
    if path == "/audit":
        return "audit:read"
    return "swarms:read" if method in ("GET", "HEAD") else "swarms:write"


def route_path(request: Request) -> str:
    """The matched route's path template (`/swarms/{swarm_id}`), whatever prefix a proxy's
    `root_path` adds; the request's path before routing."""
    route = request.scope.get("route")
    return getattr(route, "path", None) or request.url.path


def authenticate(request: Request) -> str:
    """`get_tenant` without FastAPI: the tenant, after the key and its scope are checked; binds
    the caller for the request's log lines and its audit rows (app/db/audit.py)."""
    settings: Settings = request.app.state.settings
    key = key_of(settings, request.headers.get("authorization"),
                 scope_of(request.method, route_path(request)))
    tenant = key.tenant if key is not None else DEFAULT_TENANT
    key_id = key.key_id if key is not None else None
    client = request.client
    audit.bind(audit.Caller(tenant, key_id, _request_id(request),
                            client.host[:64] if client is not None else None))
    return tenant


def _request_id(request: Request) -> str:
    """The caller's `X-Request-Id` when it is a sane one, else the trace's id, else a new one."""
    given = request.headers.get("x-request-id", "").strip()
    if given and len(given) <= 128 and given.isprintable():
        return given
    return (logs.trace_id_of(tracing.valid_traceparent(request.headers.get("traceparent")))
            or uuid.uuid4().hex)


def tenant_of(settings: Settings, authorization: str | None) -> str:
    """The tenant an Authorization header names, whatever its key's scopes (401 if none)."""
    key = key_of(settings, authorization, None)
    return key.tenant if key is not None else DEFAULT_TENANT


def key_of(settings: Settings, authorization: str | None, scope: str | None) -> ApiKey | None:
    """The caller's key (None when auth is off): 401 when missing, unknown or expired, 403
    `insufficient_scope` when it lacks `scope`. Looked up by its SHA-256, never compared as
    text; its id, not the key, is what the request's log lines name."""
    if not settings.auth_enabled:
        logs.bind(tenant=DEFAULT_TENANT)
        return None
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token")
    key = settings.keys.find(token.strip())
    if key is None:
        raise Unauthorized("invalid API key")
    if key.expired(now_utc()):
        raise Unauthorized("API key expired", details={"key_id": key.key_id})
    logs.bind(tenant=key.tenant, key_id=key.key_id)  # the request's log lines name them
    if scope is not None and scope not in key.scopes:
        raise Forbidden(f"this key lacks the scope {scope}", code="insufficient_scope",
                        details={"scope": scope, "key_id": key.key_id})
    return key


class KeyFirstRoute(APIRoute):
    """A route that checks the caller's key before FastAPI parses the body (which it does
    before resolving any dependency): a request without a valid key is a 401 whatever its
    body (as `POST /swarms`, hand-parsed, answers), never a 400 or 422."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            authenticate(request)
            return await handler(request)

        return route


async def get_engine(request: Request) -> Scheduler | None:
    engine: Scheduler | None = request.app.state.engine
    return engine


async def get_tools(request: Request) -> ToolRegistry | None:
    tools: ToolRegistry | None = request.app.state.tools
    return tools


async def get_notifier(request: Request) -> SwarmNotifier:
    notifier: SwarmNotifier = request.app.state.notifier
    return notifier


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[AsyncSession, Depends(get_session)]
TenantDep = Annotated[str, Depends(get_tenant)]
EngineDep = Annotated[Scheduler | None, Depends(get_engine)]
ToolsDep = Annotated[ToolRegistry | None, Depends(get_tools)]
NotifierDep = Annotated[SwarmNotifier, Depends(get_notifier)]
