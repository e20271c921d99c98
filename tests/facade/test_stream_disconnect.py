"""A facade stream whose client leaves while the stream reads the swarm's events (SQLite): the
read is cancelled mid-statement, and its transaction's write lock goes with its connection, so
the next write does not wait out busy_timeout and fail 'database is locked' (seen under `make
test-encrypted` as a flake of test_facade_streams)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import queries
from app.gateway.client import GatewayClient
from app.main import create_app
from app.simulator import SimulatorConfig, create_simulator
from tests.conftest import make_settings
from tests.facade.conftest import KEY
from tests.facade.live import serving
from tests.helpers import HeldStatement, collection_off, until, write_locked

SWARM = {"model": "kimi-k2.5", "stream": True,
         "messages": [{"role": "user", "content": "Audit it [[sim latency_ms=1500]]"}],
         "agent_swarm": {"enabled": True, "max_sub_agents": 2, "fan_in_strategy": "concatenate"}}
PLAIN = {"model": "deepseek-v3.2", "max_tokens": 20,
         "messages": [{"role": "user", "content": "Name a risk"}]}


async def test_a_client_gone_mid_read_leaves_the_database_unlocked(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = Path(sqlite_url.removeprefix("sqlite+aiosqlite:///"))
    held = HeldStatement()
    armed = False
    events_after = queries.events_after

    async def caught_running(s: AsyncSession, swarm_id: str, after: int) -> Any:
        nonlocal armed
        if armed:  # the next read of the stream runs until the test lets it end
            armed = False
            raw = await (await s.connection()).get_raw_connection()
            assert raw.driver_connection is not None
            await raw.driver_connection.create_function(held.NAME, 0, held)
            await s.execute(text(f"SELECT {held.NAME}()"))
        return await events_after(s, swarm_id, after)

    monkeypatch.setattr(queries, "events_after", caught_running)
    simulator = create_simulator(SimulatorConfig(latency_ms=20))
    gateway = GatewayClient("http://sim/v1", transport=httpx.ASGITransport(app=simulator))
    app = create_app(make_settings(sqlite_url, api_keys="t1:k1"), gateway=gateway)
    try:
        async with serving(app) as url, httpx.AsyncClient(
                base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
            with collection_off():  # what frees the lock is the close, not a collection
                async with c.stream("POST", "/v1/chat/completions", json=SWARM) as r:
                    assert r.status_code == 200
                    lines = r.aiter_lines()
                    while not (await anext(lines)).startswith("data:"):
                        pass
                    armed = True
                    await held.running()  # the stream's read holds the write lock
                    assert write_locked(path)
                # the client has left: its stream ends while its statement still runs
                await until(lambda: not app.state.stream_slots.open, 5, "the stream's end")
                held.release()
                await until(lambda: not write_locked(path), 5, "the write lock released")
                r = await c.post("/v1/chat/completions", json=PLAIN)  # a write: its audit row
                assert r.status_code == 200, r.text
    finally:
        held.release()
        await gateway.aclose()
