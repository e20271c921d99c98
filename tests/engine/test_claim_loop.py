"""The claim loop after a failed claim: the next one comes within a second, not at the next
poll (a minute, where LISTEN does the waking), since the wake-up that asked for it is spent."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from app.aio import wait_for
from app.api.deps import DEFAULT_TENANT
from app.db import create, leases
from app.db.tables import Swarm
from app.engine.specs import build_swarm
from app.schemas import SwarmCreate
from tests.conftest import make_settings, start_harness


async def test_a_failed_claim_is_retried_soon_not_at_the_next_poll(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real, failures, armed = leases.claim_swarms, [], [False]

    async def flaky(*args: Any, **kw: Any) -> list[leases.Claim]:
        """Once the swarm is queued, every claim fails for 0.3 s from the first: the ones its
        wake-ups ask for (its NOTIFY on PostgreSQL, the in-process wake-up)."""
        if armed[0] and (not failures or time.monotonic() - failures[0] < 0.3):
            failures.append(time.monotonic())
            raise RuntimeError("the database hiccupped")
        return await real(*args, **kw)

    monkeypatch.setattr(leases, "claim_swarms", flaky)
    settings = make_settings(database_url, poll_interval_s=60.0)
    h, close = await start_harness(settings)
    try:
        # a swarm another process queued: only a claim runs it
        body = SwarmCreate.model_validate({"task": "t", "agents": [{"name": "a"}]})
        new = build_swarm(body, settings, DEFAULT_TENANT)
        armed[0] = True
        async with h.app.state.sessions() as s, s.begin():
            await create.insert_swarm(s, new.swarm, new.subtasks)
        h.app.state.engine.wake()  # what its notification does
        data = await h.wait(new.swarm.id, timeout=10)
        assert failures and data["status"] == "succeeded", data
    finally:
        await close()


async def test_a_claim_the_stop_meets_is_drained_and_released_not_left_to_expire(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker told to stop while its claim is at the database (a rolling deploy stopping a
    worker that has just started): the runners that claim launches are drained and their
    swarms released at once with the others; none crashes on a daily cap already closed."""
    real, entered, release = leases.claim_swarms, asyncio.Event(), asyncio.Event()

    async def slow(*args: Any, **kw: Any) -> list[leases.Claim]:
        claims = await real(*args, **kw)
        if claims:
            entered.set()
            await release.wait()  # the stop begins while this claim's transaction is open
        return claims

    monkeypatch.setattr(leases, "claim_swarms", slow)
    settings = make_settings(database_url, poll_interval_s=60.0, daily_budget_usd="100")
    h, close = await start_harness(settings)
    try:
        body = SwarmCreate.model_validate({"task": "t", "agents": [
            {"name": "a", "system_prompt": "[[sim latency_ms=200]]"}]})
        new = build_swarm(body, settings, DEFAULT_TENANT)
        async with h.app.state.sessions() as s, s.begin():
            await create.insert_swarm(s, new.swarm, new.subtasks)
        h.app.state.engine.wake()
        await wait_for(entered.wait(), 10)
        engine = h.app.state.engine
        stopping = asyncio.create_task(engine.stop(grace_s=5))
        await asyncio.sleep(0.1)
        release.set()
        await wait_for(stopping, 20)
        async with h.app.state.sessions() as s:
            row = await s.get(Swarm, new.swarm.id)
        assert row is not None and row.lease_owner is None, row and row.lease_owner
        assert row.rescues == 0
    finally:
        await close()
