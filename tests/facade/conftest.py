"""Fixtures of the facade's tests: the service under a real uvicorn server (the OpenAI SDK
brings its own HTTP stack), its gateway the in-process simulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from app.gateway.client import GatewayClient
from app.main import create_app
from app.simulator import SimulatorConfig, create_simulator
from tests.conftest import make_settings
from tests.facade.live import serving

KEY = "k1"


@dataclass
class Facade:
    base_url: str
    http: httpx.AsyncClient  # the service's own routes, as tenant t1
    simulator: Any

    def sdk(self, **kw: Any) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=KEY, **kw)

    async def swarm(self, swarm_id: str) -> dict[str, Any]:
        r = await self.http.get(f"/swarms/{swarm_id}")
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        return data


    async def direct(self, body: dict[str, Any]) -> httpx.Response:
        """The simulator's own answer to `body` (deterministic: what passthrough must relay)."""
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.simulator),
                                     base_url="http://sim") as c:
            return await c.post("/v1/chat/completions", json=body)

    async def usage(self) -> dict[str, Any]:
        r = await self.http.get("/usage", params={"group_by": "model"})
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        return data


@asynccontextmanager
async def start_facade(database_url: str, run_engine: bool = True, gateway_app: Any = None,
                       gateway: GatewayClient | None = None,
                       **settings: Any) -> AsyncIterator[Facade]:
    """The service on `database_url`; `run_engine=False` is an API replica (no engine);
    `gateway_app`: an ASGI app to be the gateway instead of the simulator; `gateway`: the
    client of a gateway served over HTTP (`gateway_app` then is that gateway's app)."""
    simulator = gateway_app or create_simulator(SimulatorConfig(latency_ms=20))
    if gateway is None:
        gateway = GatewayClient("http://sim/v1", transport=httpx.ASGITransport(app=simulator))
    app = create_app(make_settings(database_url, api_keys="t1:k1,t2:k2", **settings),
                     gateway=gateway, run_engine=run_engine)
    try:
        async with serving(app) as url, httpx.AsyncClient(
                base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
            yield Facade(url, http, simulator)
    finally:
        await gateway.aclose()


@pytest.fixture
async def facade(database_url: str) -> AsyncIterator[Facade]:
    """On SQLite and on Postgres."""
    async with start_facade(database_url) as f:
        yield f


@pytest.fixture
async def facade_sqlite(sqlite_url: str) -> AsyncIterator[Facade]:
    """For what does not depend on the database."""
    async with start_facade(sqlite_url) as f:
        yield f
