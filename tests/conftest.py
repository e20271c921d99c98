"""Fixtures: throwaway databases (SQLite files and real PostgreSQL), the simulator, the app."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette

from app.config import Settings
from app.crypto import Sealer
from app.db.migrate import upgrade_head
from app.db.sealed import use_sealer
from app.db.session import SessionFactory, asyncpg_dsn, make_db_engine, make_session_factory
from app.gateway import client as client_module
from app.gateway.client import GatewayClient
from app.main import create_app
from app.simulator import SimulatorConfig, create_simulator
from tests import gateway_support
from tests.support import PG_URL, drop_db, pg_admin, throwaway_db, with_db

SKIP_PG = os.environ.get("SWARM_TEST_SKIP_POSTGRES") == "1"
# the encrypted suite (`make test-encrypted`): SWARM_ENCRYPTION_KEYS set for the whole run,
# so every Settings a test builds (and every process it starts) encrypts content at rest
ENV_SEALER = Sealer.from_setting(os.environ.get("SWARM_ENCRYPTION_KEYS", ""))


@pytest.fixture(autouse=True)
def _process_keys() -> Iterator[None]:
    """Each test starts with the run's keys in force (a test's own Runtime may set others;
    engines a test builds itself read through the keys in force)."""
    use_sealer(ENV_SEALER)
    yield
    use_sealer(ENV_SEALER)
BACKENDS = ["sqlite"] if SKIP_PG else ["sqlite", "postgres"]


@pytest.fixture(autouse=True)
def _latency_devices_pinned(request: pytest.FixtureRequest,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A test of a latency device's mechanism (`@pytest.mark.latency_devices`) runs with the
    devices on, whatever SWARM_LATENCY_DEVICES says (`make test-plain` turns them off)."""
    if request.node.get_closest_marker("latency_devices") is not None:
        monkeypatch.setenv("SWARM_LATENCY_DEVICES", "on")


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated throwaway Postgres database for the session (dropped at the end)."""
    name = f"swarm_test_{uuid.uuid4().hex[:10]}"
    try:
        asyncio.run(pg_admin(f'CREATE DATABASE "{name}"'))
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {PG_URL} ({exc!r}). Start it, point "
            "SWARM_TEST_DATABASE_URL at one, or set SWARM_TEST_SKIP_POSTGRES=1 to run "
            "the SQLite half only.", pytrace=False)
    url = with_db(PG_URL, name)
    upgrade_head(url)
    yield url
    asyncio.run(drop_db(name))


@pytest.fixture(scope="session")
def proc_template() -> Iterator[str]:
    """A migrated Postgres database that nobody connects to: `db_url` copies it."""
    with throwaway_db("swarm_tpl") as url:
        yield url.rsplit("/", 1)[1]


@pytest.fixture
def db_url(proc_template: str) -> Iterator[str]:
    """A new, migrated Postgres database of its own, for tests that run real processes."""
    with throwaway_db("swarm_proc", template=proc_template) as url:
        yield url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    upgrade_head(f"sqlite+aiosqlite:///{path}")
    return path


async def _truncate(url: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(url), timeout=5)
    try:
        await conn.execute("TRUNCATE swarms, subtasks, gateway_calls, events, webhooks, "
                           "webhook_attempts, daily_spend, daily_reservations, tenant_buckets, "
                           "tenant_daily_spend, tenant_daily_reservations, tenant_queues, "
                           "tenant_active, audit CASCADE")
    finally:
        await conn.close()


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no tables yet (for tests of the migrations themselves)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"
    else:
        with throwaway_db("swarm_mig", migrate=False) as url:
            yield url


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database: a fresh SQLite file, or the truncated Postgres one."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "swarm.db"
        shutil.copy(template, path)
        return f"sqlite+aiosqlite:///{path}"
    url: str = request.getfixturevalue("pg_template")
    asyncio.run(_truncate(url))
    return url


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> str:
    """PostgreSQL only (what is its alone): the session's database, truncated."""
    if SKIP_PG:
        pytest.skip("SWARM_TEST_SKIP_POSTGRES=1")
    url: str = request.getfixturevalue("pg_template")
    asyncio.run(_truncate(url))
    return url


@pytest.fixture
async def pg_sessions(pg_url: str) -> AsyncIterator[SessionFactory]:
    """Sessions on `pg_url`'s database, for tests that drive app/db directly."""
    engine = make_db_engine(pg_url)
    yield make_session_factory(engine)
    await engine.dispose()


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """SQLite only (API behaviour that does not depend on the database)."""
    path = tmp_path / "swarm.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite+aiosqlite:///{path}"


def make_settings(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"database_url": database_url, "poll_interval_s": 0.2,
                              "lease_seconds": 5.0, "shutdown_grace_s": 0.0}
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


class Harness:
    """A running app (engine in-process) wired to a simulator, with an HTTP client."""

    def __init__(self, app: FastAPI, client: httpx.AsyncClient, simulator: Starlette) -> None:
        self.app = app
        self.client = client
        self.simulator = simulator

    @property
    def sim_stats(self) -> Any:
        return self.simulator.state.stats

    async def stats(self) -> dict[str, Any]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.simulator),
                                     base_url="http://sim") as c:
            data: dict[str, Any] = (await c.get("/v1/_stats")).json()
            return data

    async def post(self, body: dict[str, Any], **kw: Any) -> httpx.Response:
        return await self.client.post("/swarms", json=body, **kw)

    async def release_db(self) -> None:
        """Close what a closed harness's pool reopened (tests that write through it after
        `close()`). Left to the garbage collector, an aiosqlite connection finishes on its own
        thread after the test's loop has closed, and fails the next test's setup."""
        await self.app.state.db_engine.dispose()

    async def run(self, body: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
        """Create a swarm and wait until it is terminal."""
        r = await self.post(body)
        assert r.status_code == 202, r.text
        return await self.wait(r.json()["id"], timeout)

    async def wait(self, swarm_id: str, timeout: float = 30) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            assert left > 0, f"swarm {swarm_id} not terminal after {timeout}s"
            r = await self.client.get(f"/swarms/{swarm_id}", params={"wait": min(left, 10)})
            assert r.status_code == 200, r.text
            data: dict[str, Any] = r.json()
            if data["status"] in ("succeeded", "failed", "cancelled"):
                return data


@asynccontextmanager
async def app_on(settings: Settings, gateway: GatewayClient) -> AsyncIterator[httpx.AsyncClient]:
    """The app (engine in-process) on a gateway a test scripts, its lifespan run; a client to
    it. The gateway is closed after."""
    app = create_app(settings, gateway=gateway)
    try:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            yield client
    finally:
        await gateway.aclose()


async def start_harness(settings: Settings, sim_config: SimulatorConfig | None = None,
                        run_engine: bool = True,
                        webhook_transport: httpx.AsyncBaseTransport | None = None,
                        ) -> tuple[Harness, Any]:
    simulator = create_simulator(sim_config or SimulatorConfig(latency_ms=0))
    gateway = GatewayClient("http://sim/v1", transport=httpx.ASGITransport(app=simulator),
                            max_inflight=settings.max_inflight)
    app = create_app(settings, gateway=gateway, run_engine=run_engine,
                     webhook_transport=webhook_transport)
    ctx = app.router.lifespan_context(app)
    await ctx.__aenter__()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")
    harness = Harness(app, client, simulator)

    async def close() -> None:
        await client.aclose()
        await ctx.__aexit__(None, None, None)
        await gateway.aclose()

    return harness, close


@pytest.fixture
async def harness(database_url: str) -> AsyncIterator[Harness]:
    """App + engine + zero-latency simulator on each database backend."""
    h, close = await start_harness(make_settings(database_url))
    yield h
    await close()


@pytest.fixture
async def api(sqlite_url: str) -> AsyncIterator[Harness]:
    """App + engine on SQLite only, for API-shape tests."""
    h, close = await start_harness(make_settings(sqlite_url))
    yield h
    await close()


# ---- GatewayClient against a scripted gateway (tests/gateway_support.py) ----


@pytest.fixture
async def make_client() -> AsyncIterator[Callable[..., GatewayClient]]:
    clients: list[GatewayClient] = []

    def make(gateway: gateway_support.Gateway,
             api_key: str = gateway_support.API_KEY) -> GatewayClient:
        clients.append(GatewayClient(gateway_support.BASE_URL, api_key,
                                     transport=httpx.MockTransport(gateway)))
        return clients[-1]

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Retry waits the client asked for, recorded instead of slept."""
    asked: list[float] = []

    async def record(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(client_module, "_sleep", record)
    return asked
