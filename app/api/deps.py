"""Annotated dependencies: settings, a session, the caller's tenant, the engine hooks."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Header, Request, Response, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession

from app import logs
from app.config import Settings
from app.engine.scheduler import Scheduler
from app.engine.waiters import SwarmNotifier
from app.errors import Unauthorized
from app.tools.registry import ToolRegistry

DEFAULT_TENANT = "default"


# Every dependency is `async def`, even those that only read app.state: FastAPI runs a plain
# `def` dependency in its thread pool, a thread hop (and a wait for a free thread under load)
# per dependency per request (bench/RESULTS.md, "Creation")


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as session:
        yield session


# the OpenAPI document's security scheme, on every route that resolves the tenant; it never
# refuses (auto_error=False): tenant_of checks the key and answers 401 in the API's shape
BEARER = HTTPBearer(scheme_name="bearer", auto_error=False,
                    description="A key of SWARM_API_KEYS, which names the caller's tenant "
                                "(needed when SWARM_API_KEYS is set)")


async def get_tenant(
    request: Request,
    _documented: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> str:
    """The caller's tenant from `Authorization: Bearer <key>`; everyone is one tenant when
    SWARM_API_KEYS is empty."""
    return tenant_of(request.app.state.settings, authorization)


def tenant_of(settings: Settings, authorization: str | None) -> str:
    """`get_tenant` without FastAPI: the tenant an Authorization header names (401 if none)."""
    if not settings.auth_enabled:
        logs.bind(tenant=DEFAULT_TENANT)
        return DEFAULT_TENANT
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("missing bearer token")
    for key, tenant in settings.tenant_keys.items():
        if hmac.compare_digest(key.encode(), token.strip().encode()):
            logs.bind(tenant=tenant)  # the request's log lines name it (SPEC §17)
            return tenant
    raise Unauthorized("invalid API key")


class KeyFirstRoute(APIRoute):
    """A route that checks the caller's key before FastAPI parses the body (which it does
    before resolving any dependency): a request without a valid key is a 401 whatever its
    body (as `POST /swarms`, hand-parsed, answers), never a 400 or 422."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            tenant_of(request.app.state.settings, request.headers.get("authorization"))
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
