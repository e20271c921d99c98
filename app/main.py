"""create_app(settings) -> FastAPI; the lifespan wires database, gateway and engine."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI

from app import metrics
from app.api import approval, audit, errors, openai, ops, retry, swarms, usage
from app.api import estimate as estimate_api
from app.api import tools as tools_api
from app.api.admission import StreamSlots
from app.api.openai_errors import openai_responses
from app.api.sse import shutting_down
from app.config import Settings
from app.gateway.client import GatewayClient
from app.middleware import AccessLog, BodyLimit, HeadAsGet, HttpMetrics, LoopbackOnly
from app.runtime import Runtime
from app.ui import routes as ui
from app.ui.docs import offline_fastapi

log = logging.getLogger(__name__)

DESCRIPTION = """Runs LLM agent swarms: `POST /swarms` with a task (and optionally named agents),
then poll `GET /swarms/{id}?wait=30` or stream `GET /swarms/{id}/events`. Errors always have the
shape `{"error": {"code", "message", "details"}}`."""


async def _stop_when_failed(app: FastAPI, runtime: Runtime) -> None:
    """A dead engine side task ends the server (non-zero exit) so a supervisor restarts it."""
    reason = await runtime.wait_failed()
    app.state.died = reason
    log.critical("stopping the server: %s", reason)
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown


def _stop_with_parent(app: FastAPI) -> None:
    """In a process of `serve --workers N`: stop (gracefully) when the parent that supervises
    it is gone, even killed with SIGKILL; an orphan would go on serving the port and running
    swarms beside the next instance."""
    parent = multiprocessing.parent_process()  # None unless spawned by multiprocessing
    if parent is None:
        return
    loop = asyncio.get_running_loop()

    def gone() -> None:  # the sentinel becomes readable when the parent exits
        loop.remove_reader(parent.sentinel)
        app.state.died = f"the parent process {parent.pid} exited"
        log.critical("stopping: %s", app.state.died)
        os.kill(os.getpid(), signal.SIGTERM)

    loop.add_reader(parent.sentinel, gone)


def _reload_keys_on_hup(settings: Settings) -> bool:
    """SIGHUP reads the tenants file's keys again (a rotation without a restart; its mtime is
    watched too). False where no handler could be set: no file, or not the main thread."""
    if not settings.tenants_file or not hasattr(signal, "SIGHUP"):
        return False
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, settings.keys.reload)
    except (RuntimeError, ValueError, NotImplementedError):
        return False
    return True


def create_app(settings: Settings | None = None, *, gateway: GatewayClient | None = None,
               run_engine: bool | None = None,
               webhook_transport: httpx.AsyncBaseTransport | None = None,
               freeze_gc: bool = False) -> FastAPI:
    """The API; with `run_engine` (default: SWARM_ENGINE) the engine runs in its event loop.
    `freeze_gc`: the app is its process's (`serve`), see `runtime.freeze_startup_objects`."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(settings, run_engine=settings.engine if run_engine is None
                          else run_engine, listen_changes=True, gateway=gateway,
                          webhook_transport=webhook_transport, freeze_gc=freeze_gc)
        async with runtime:
            app.state.settings = settings
            app.state.db_engine = runtime.db
            app.state.sessions = runtime.sessions
            app.state.notifier = runtime.notifier
            runtime.notifier.stopping = shutting_down
            runtime.notifier.renderer = swarms.ended_answer
            app.state.engine = runtime.engine
            app.state.gateway = runtime.gateway  # the facade's passthrough calls use both
            app.state.daily = runtime.daily
            app.state.tenant_gates = runtime.tenants
            app.state.inflight = runtime.inflight  # SWARM_MAX_INFLIGHT, the engine's too
            app.state.tools = runtime.tools
            app.state.retention = runtime.retention  # the retention sweep of this process
            watch = asyncio.create_task(_stop_when_failed(app, runtime), name="side-monitor")
            _stop_with_parent(app)
            hup = _reload_keys_on_hup(settings)
            try:
                yield
            finally:
                watch.cancel()
                if hup:
                    asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        metrics.process_exiting()

    # /docs and /redoc served offline, operation ids named after the route functions
    app = offline_fastapi(title="Swarm API", version="0.1.0", description=DESCRIPTION,
                          lifespan=lifespan)
    app.state.settings = settings
    app.state.died = None
    app.state.tools = None
    metrics.set_price_table(settings.prices)
    _ = settings.tenants  # SWARM_TENANTS_FILE is read and checked now, not at a first request
    app.state.stream_slots = StreamSlots()  # max_streams, per tenant in this process
    errors.install(app)
    # routes that read or write the database answer 503 while it is unreachable
    # 403: a client off loopback, or a Host not loopback's, while the API is open (LoopbackOnly)
    app.include_router(swarms.router, responses=errors.error_responses(403, 503))
    app.include_router(retry.router, responses=errors.error_responses(403, 503))
    app.include_router(estimate_api.router, responses=errors.error_responses(403, 503))
    app.include_router(approval.router, responses=errors.error_responses(403, 503))
    app.include_router(usage.router, responses=errors.error_responses(403, 503))
    app.include_router(audit.router, responses=errors.error_responses(403, 503))
    app.include_router(openai.router, responses=openai_responses(403))  # OpenAI's shape
    app.include_router(tools_api.router, responses=errors.error_responses(403))
    app.include_router(ops.router)
    ui.install(app)  # /ui pages and their assets
    app.add_middleware(HeadAsGet)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    if not settings.auth_enabled and not settings.allow_open:
        # the CLI refuses the bind; other servers get this, and every server the Host check
        app.add_middleware(LoopbackOnly, hosts=settings.allowed_host_names)
    app.add_middleware(HttpMetrics)
    if settings.access_log:
        app.add_middleware(AccessLog)  # outermost: the 403s and 413s above are requests too
    if not settings.auth_enabled:
        _documented_open(app)
    return app


def _documented_open(app: FastAPI) -> None:
    """Without SWARM_API_KEYS no route needs a key: the document drops the bearer scheme its
    routes declare (a generated client would send one; a conformance check, schemathesis'
    ignored_auth, expects a 401 without it)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()  # FastAPI's, cached on the app: changed in place, once
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    if isinstance(operation, dict):
                        operation.pop("security", None)
            schema.get("components", {}).pop("securitySchemes", None)
        return app.openapi_schema or generate()

    app.openapi = openapi  # type: ignore[method-assign]


def serve_app() -> FastAPI:
    """The app of one process of `serve --workers N` (uvicorn's factory): its settings from
    the environment, and the process is its own."""
    return create_app(freeze_gc=True)
