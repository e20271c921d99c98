"""Fixtures of the simulator's tests: its app at 0 ms, and a client on it in process."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from app.simulator import SimulatorConfig, create_simulator
from tests.simulator_support import sim_client


@pytest.fixture
def app() -> Starlette:
    return create_simulator(SimulatorConfig(latency_ms=0))


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with sim_client(app) as c:
        yield c
