"""create_app(settings) -> FastAPI; the lifespan wires database, gateway and engine."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI

from app.api import errors, ops, swarms
from app.config import Settings
from app.db.migrate import upgrade_head_async
from app.db.session import make_engine, make_session_factory
from app.engine.notify import SwarmNotifier
from app.engine.scheduler import Engine
from app.gateway.client import GatewayClient
from app.middleware import BodyLimit, HttpMetrics
from app.simulator import SimulatorConfig, create_simulator

log = logging.getLogger(__name__)
SIMULATOR_BASE_URL = "http://simulator.internal/v1"

DESCRIPTION = """Runs LLM agent swarms: `POST /swarms` with a task (and optionally named agents),
then poll `GET /swarms/{id}?wait=30` or stream `GET /swarms/{id}/events`. Errors always have the
shape `{"error": {"code", "message", "details"}}`."""


def make_gateway(settings: Settings) -> GatewayClient:
    """The configured gateway, or the built-in simulator in-process when none is set."""
    if settings.gateway_url:
        return GatewayClient(settings.gateway_url, settings.gateway_api_key.get_secret_value(),
                             max_inflight=settings.max_inflight)
    sim = create_simulator(SimulatorConfig(
        latency_ms=settings.simulator_latency_ms,
        latency_jitter_ms=settings.simulator_latency_jitter_ms))
    return GatewayClient(SIMULATOR_BASE_URL, max_inflight=settings.max_inflight,
                         transport=httpx.ASGITransport(app=sim))


def create_app(settings: Settings | None = None, *, gateway: GatewayClient | None = None,
               run_engine: bool | None = None) -> FastAPI:
    """The API; with `run_engine` (default: SWARM_ENGINE) the engine runs in its event loop."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_start:
            await upgrade_head_async(settings.database_url)
        db = make_engine(settings.database_url)
        sessions = make_session_factory(db)
        client = gateway or make_gateway(settings)
        notifier = SwarmNotifier()
        engine: Engine | None = None
        if settings.engine if run_engine is None else run_engine:
            engine = Engine(settings, sessions, client, notifier)
            await engine.start()
        app.state.settings = settings
        app.state.db_engine = db
        app.state.sessions = sessions
        app.state.notifier = notifier
        app.state.engine = engine
        try:
            yield
        finally:
            if engine is not None:
                await engine.stop()
            if gateway is None:
                await client.aclose()
            await db.dispose()

    app = FastAPI(title="Swarm API", version="0.1.0", description=DESCRIPTION,
                  lifespan=lifespan)
    app.state.settings = settings
    errors.install(app)
    app.include_router(swarms.router)
    app.include_router(ops.router)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(HttpMetrics)
    return app
