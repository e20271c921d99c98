"""create_app(settings) -> FastAPI; the lifespan wires database, gateway and engine."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI

from app import metrics
from app.api import errors, ops, swarms, usage
from app.config import Settings
from app.db.migrate import upgrade_head_async
from app.db.notify import CHANGED
from app.db.session import SessionFactory, make_engine, make_session_factory
from app.engine.budget import DailyCap
from app.engine.notify import SwarmNotifier
from app.engine.scheduler import Engine, process_owner
from app.engine.wakeup import PgListener
from app.gateway.client import GatewayClient
from app.middleware import BodyLimit, HttpMetrics
from app.simulator import SimulatorConfig, create_simulator
from app.webhooks import WebhookDispatcher

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


def make_engine_with_cap(settings: Settings, sessions: SessionFactory, gateway: GatewayClient,
                         notifier: SwarmNotifier | None = None) -> tuple[Engine, DailyCap | None]:
    """The engine of this process, sharing SWARM_DAILY_BUDGET_USD (when set) through the
    database with every other process; close the cap after stopping the engine."""
    owner = process_owner()
    daily = None
    if settings.daily_budget_usd is not None:
        daily = DailyCap(sessions, settings.daily_budget_usd, owner,
                         lease_s=settings.lease_seconds)
    return Engine(settings, sessions, gateway, notifier, owner=owner, daily=daily), daily


def create_app(settings: Settings | None = None, *, gateway: GatewayClient | None = None,
               run_engine: bool | None = None,
               webhook_transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
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
        daily: DailyCap | None = None
        hooks: WebhookDispatcher | None = None
        if settings.engine if run_engine is None else run_engine:
            engine, daily = make_engine_with_cap(settings, sessions, client, notifier)
            await engine.start()
            hooks = WebhookDispatcher(settings, sessions, transport=webhook_transport)
            hooks.start()
        # readers of swarms run elsewhere (?wait=, SSE) wake on their commits
        listener = None if settings.is_sqlite else PgListener(
            settings.database_url, {CHANGED: notifier.notify})
        if listener is not None:
            listener.start()
        app.state.settings = settings
        app.state.db_engine = db
        app.state.sessions = sessions
        app.state.notifier = notifier
        app.state.engine = engine
        try:
            yield
        finally:
            if listener is not None:
                await listener.stop()
            if engine is not None:
                await engine.stop()
            if hooks is not None:
                await hooks.stop()
            if daily is not None:
                await daily.close()
            if gateway is None:
                await client.aclose()
            await db.dispose()

    app = FastAPI(title="Swarm API", version="0.1.0", description=DESCRIPTION,
                  lifespan=lifespan)
    app.state.settings = settings
    metrics.set_price_table(settings.prices)
    errors.install(app)
    # routes that read or write the database answer 503 while it is unreachable
    app.include_router(swarms.router, responses=errors.error_responses(503))
    app.include_router(usage.router, responses=errors.error_responses(503))
    app.include_router(ops.router)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(HttpMetrics)
    return app
