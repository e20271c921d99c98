"""The one composition root of a `serve` or `worker` process: everything it runs but HTTP."""

from __future__ import annotations

import asyncio
import gc
import logging
from contextlib import AsyncExitStack
from types import TracebackType

import httpx

from app import metrics, tracing
from app.aio import cancel_and_wait
from app.config import Settings
from app.db.dialect import change_listener, dialect_of, migrates_on_start, notify_sender
from app.db.migrate import upgrade_head_async
from app.db.notify import CHANGED
from app.db.retry import log_db_failure
from app.db.session import SessionFactory, make_db_engine, make_session_factory
from app.engine import faults
from app.engine.approval_sweep import ApprovalSweep
from app.engine.budget import DailyCap
from app.engine.deltas import CHANNEL as DELTAS
from app.engine.passthrough import settle_stale
from app.engine.retention import RetentionSweep
from app.engine.scheduler import Scheduler, process_owner
from app.engine.tenancy import TenantGates
from app.engine.waiters import SwarmNotifier
from app.gateway.asgi import StreamingASGITransport
from app.gateway.client import GatewayClient
from app.simulator import SimulatorConfig, create_simulator
from app.tools.registry import ToolRegistry
from app.webhooks import WebhookDispatcher

log = logging.getLogger(__name__)
SIMULATOR_BASE_URL = "http://simulator.internal/v1"


def make_gateway(settings: Settings) -> GatewayClient:
    """The configured gateway, or the built-in simulator in-process when none is set."""
    if settings.gateway_url:
        return GatewayClient(settings.gateway_url, settings.gateway_api_key.get_secret_value(),
                             max_inflight=settings.max_inflight,
                             keepalive_s=settings.gateway_keepalive_s)
    sim = create_simulator(SimulatorConfig(
        latency_ms=settings.simulator_latency_ms,
        latency_jitter_ms=settings.simulator_latency_jitter_ms,
        exit_allowed=settings.simulator_exit_allowed))
    return GatewayClient(SIMULATOR_BASE_URL, max_inflight=settings.max_inflight,
                         transport=StreamingASGITransport(sim))


async def start_tools(settings: Settings) -> ToolRegistry | None:
    """The MCP servers of SWARM_MCP_CONFIG, started (a server that cannot start is logged and
    stays `down`; an unreadable config file is an error)."""
    if not settings.mcp_config:
        return None
    tools = ToolRegistry.from_file(settings.mcp_config,
                                   result_max_bytes=settings.tool_result_max_bytes,
                                   args_max_bytes=settings.tool_args_max_bytes,
                                   http_sessions=settings.mcp_http_sessions)
    await tools.start()
    return tools


def make_scheduler(settings: Settings, sessions: SessionFactory, gateway: GatewayClient,
                         notifier: SwarmNotifier | None = None,
                         tools: ToolRegistry | None = None) -> tuple[Scheduler, DailyCap | None]:
    """The engine of this process, sharing SWARM_DAILY_BUDGET_USD (when set) through the
    database with every other process; close the cap after stopping the engine."""
    owner = process_owner()
    daily = None
    if settings.daily_budget_usd is not None:
        daily = DailyCap(sessions, settings.daily_budget_usd, owner,
                         lease_s=settings.lease_seconds)
    return Scheduler(settings, sessions, gateway, notifier, owner=owner, daily=daily,
                  tools=tools), daily


async def _settle_stale_passthrough(sessions: SessionFactory) -> None:
    """Passthrough attempts a dead process left `in_flight` count (at their reservation) from
    now on; a database that does not answer yet must not stop the start (nor hold it: this
    runs beside it, and its retries took 15 s before the port opened)."""
    try:
        n = await settle_stale(sessions)
    except Exception as exc:
        log_db_failure(log, "settling stale passthrough attempts", exc, "the next start retries")
        return
    if n:
        log.warning("%d passthrough attempts of a dead process settled as unknown", n)


# CPython collects generation 0 after 700 net allocations of container objects; a subtask
# allocates thousands (request and response dicts, ORM rows, events), so with hundreds in
# flight the collector ran many times per subtask, and every older-generation pass walked every
# row of every running swarm (docs/decisions/0012-garbage-collector.md); the older generations
# keep CPython's ratios (10, 10), so cyclic garbage of a long-running process is still
# collected as often, relatively.
GC_THRESHOLDS = (10_000, 10, 10)


def tune_gc() -> None:
    gc.set_threshold(*GC_THRESHOLDS)


def freeze_startup_objects() -> None:
    """Move what is alive once a process has started (modules, classes, the app, its pools:
    a few hundred thousand objects) to the collector's permanent generation. They live as long
    as the process, yet every full collection walked them with the event loop standing still
    (docs/decisions/0012-garbage-collector.md). For `serve`
    and `worker` processes only: freezing is process-wide, and a test process that starts
    hundreds of apps would keep each one's garbage forever."""
    gc.collect()
    gc.freeze()


class Runtime:
    """Database, gateway client, engine (with its daily cap and webhook dispatcher) and the
    change listener, started in order and stopped in reverse, for `serve` and `worker` alike.

    `run_engine=False` is an API replica; `listen_changes` wakes this process's `?wait=` and SSE
    readers on other processes' commits (PostgreSQL only: SQLite runs one process)."""

    def __init__(self, settings: Settings, *, run_engine: bool, listen_changes: bool,
                 gateway: GatewayClient | None = None,
                 webhook_transport: httpx.AsyncBaseTransport | None = None,
                 freeze_gc: bool = False) -> None:
        self.settings = settings
        self._freeze_gc = freeze_gc
        self._run_engine = run_engine
        self._listen = listen_changes and dialect_of(settings.database_url).listens_for_changes
        self._given_gateway = gateway
        self._webhook_transport = webhook_transport
        self._stack = AsyncExitStack()
        self.notifier = SwarmNotifier()
        self.engine: Scheduler | None = None
        self.daily: DailyCap | None = None  # SWARM_DAILY_BUDGET_USD, shared by engine and API
        self.tenants: TenantGates | None = None  # per-tenant caps and slots (SPEC §8), likewise
        # SWARM_MAX_INFLIGHT: the engine's calls and the facade's passthrough calls share it
        self.inflight = asyncio.Semaphore(settings.max_inflight)
        self.tools: ToolRegistry | None = None
        self.retention: RetentionSweep | None = None  # started with the database

    async def __aenter__(self) -> Runtime:
        settings, stack = self.settings, self._stack
        await stack.__aenter__()
        try:
            tune_gc()
            faults.arm(settings.crash_at)
            metrics.set_daily_budget(settings.daily_budget_usd)
            if tracing.configure():  # only when OTEL_* asks for traces
                stack.callback(tracing.shutdown)
            if migrates_on_start(settings.database_url, settings.auto_migrate):
                await upgrade_head_async(settings.database_url, settings.migrations_dir)
            self.db = make_db_engine(settings.database_url)
            stack.push_async_callback(self.db.dispose)
            self.sessions = make_session_factory(self.db)
            await self._settle_stale()
            # every process, API replicas too: one at a time erases what is past retention
            self.retention = RetentionSweep(settings, self.sessions)
            self.retention.start()
            stack.push_async_callback(self.retention.stop)
            self.gateway = self._given_gateway or make_gateway(settings)
            if self._given_gateway is None:
                stack.push_async_callback(self.gateway.aclose)
            # every process: the engine calls tools, the API lists them and checks requests
            self.tools = await start_tools(settings)
            if self.tools is not None:
                stack.push_async_callback(self.tools.stop)
            if self._run_engine:
                await self._start_engine()
            elif settings.daily_budget_usd is not None:  # the OpenAI facade's passthrough
                self.daily = DailyCap(self.sessions, settings.daily_budget_usd, process_owner(),
                                      lease_s=settings.lease_seconds)
                stack.push_async_callback(self.daily.close)
            if self.engine is not None:
                self.tenants = self.engine.ctx.tenants
                self.inflight = self.engine.ctx.inflight
            else:  # the facade's passthrough meters against the tenant's daily cap too
                self.tenants = TenantGates(settings.tenants, self.sessions, process_owner(),
                                           settings.lease_seconds, self.daily)
                stack.push_async_callback(self.tenants.close)
            # the readers of this process's swarms' tokens in the other processes
            if (sender := notify_sender(settings.database_url, DELTAS)) is not None:
                self.notifier.deltas.send_to(sender)
                stack.push_async_callback(self.notifier.deltas.close)
            if self._listen and (listener := change_listener(
                    settings.database_url, {CHANGED: self.notifier.notified,
                                            DELTAS: self.notifier.deltas.received},
                    on_connect=self.notifier.notify_all)) is not None:
                listener.start()
                stack.push_async_callback(listener.stop)
            if self._freeze_gc:
                freeze_startup_objects()
        except BaseException:
            await stack.aclose()
            raise
        return self

    async def _settle_stale(self) -> None:
        """An API process's start settles the facade's attempts a dead process left: on
        PostgreSQL beside the start, as the database may not answer yet (only attempts older
        than the horizon, so none of this process's own); SQLite, a local file, answers, and
        aiosqlite's thread must not outlive the loop of a cancelled query."""
        if not dialect_of(self.settings.database_url).shared:
            await _settle_stale_passthrough(self.sessions)
        elif self._listen:
            task = asyncio.create_task(_settle_stale_passthrough(self.sessions),
                                       name="settle stale passthrough")
            self._stack.push_async_callback(cancel_and_wait, task)

    async def _start_engine(self) -> None:
        engine, daily = make_scheduler(self.settings, self.sessions, self.gateway,
                                             self.notifier, self.tools)
        if daily is not None:
            self._stack.push_async_callback(daily.close)  # after the engine has stopped
        self.daily = daily
        hooks = WebhookDispatcher(self.settings, self.sessions,
                                  transport=self._webhook_transport)
        hooks.start()
        self._stack.push_async_callback(hooks.stop)
        sweep = ApprovalSweep(self.sessions, self.settings.poll_interval_s, self.notifier)
        sweep.start()
        self._stack.push_async_callback(sweep.stop)
        await engine.start()
        self._stack.push_async_callback(engine.stop)
        self.engine = engine

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self._stack.aclose()

    async def wait_failed(self) -> str:
        """Return (with the reason) when one of the engine's side tasks died; never returns
        for a process without an engine."""
        if self.engine is None:
            await asyncio.Event().wait()
        assert self.engine is not None
        await self.engine.died.wait()
        return self.engine.death or "a side task died"
