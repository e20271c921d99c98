"""The composition root and the engine's side-task monitor."""

from __future__ import annotations

import asyncio

import httpx

from app.aio import wait_for
from app.gateway.client import GatewayClient
from app.runtime import Runtime
from app.simulator import SimulatorConfig, create_simulator
from tests.conftest import make_settings


def _gateway() -> GatewayClient:
    sim = create_simulator(SimulatorConfig(latency_ms=0))
    return GatewayClient("http://sim/v1", transport=httpx.ASGITransport(app=sim))


async def test_a_side_task_that_dies_is_reported_and_a_stop_is_not(sqlite_url: str) -> None:
    gateway = _gateway()
    settings = make_settings(sqlite_url)
    async with Runtime(settings, run_engine=True, listen_changes=True,
                       gateway=gateway) as runtime:
        engine = runtime.engine
        assert engine is not None
        failed = asyncio.create_task(runtime.wait_failed())
        await asyncio.sleep(0.05)
        assert not failed.done()  # a healthy engine
        heartbeat = next(t for t in engine._side if t.get_name() == "engine-heartbeat")
        heartbeat.cancel()
        reason = await wait_for(failed, 5)
        assert "engine-heartbeat ended unexpectedly" in reason
        assert engine.died.is_set()

    # a graceful stop ends every side task without reporting a death
    async with Runtime(settings, run_engine=True, listen_changes=True,
                       gateway=gateway) as runtime:
        engine = runtime.engine
        assert engine is not None
    assert not engine.died.is_set() and engine.death is None
    await gateway.aclose()


async def test_a_replica_without_engine_never_reports_failure(sqlite_url: str) -> None:
    gateway = _gateway()
    async with Runtime(make_settings(sqlite_url), run_engine=False, listen_changes=True,
                       gateway=gateway) as runtime:
        assert runtime.engine is None
        failed = asyncio.create_task(runtime.wait_failed())
        await asyncio.sleep(0.05)
        assert not failed.done()
        failed.cancel()
    await gateway.aclose()
