"""The claim loop after a failed claim: the next one comes within a second, not at the next
poll (a minute, where LISTEN does the waking), since the wake-up that asked for it is spent."""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.api.deps import DEFAULT_TENANT
from app.db import create, leases
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
