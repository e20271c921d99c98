"""A cancel that ends a queued swarm itself (its owner's lease lapsed) fences that owner out
(SPEC §4: a process that lost its lease commits nothing after another took over): paused
after adopting the swarm, the owner resumes, finds its lease gone and writes nothing — the
swarm stays `cancelled`, with one `swarm.completed` (both backends)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import select

from app.db.tables import Event
from app.engine.runner import SwarmRunner
from app.engine.scheduler import Scheduler
from tests.conftest import make_settings, start_harness

ONE = {"task": "t", "agents": [{"name": "a"}], "synthesis": {"strategy": "none"}}


async def test_a_cancel_of_a_lapsed_owners_queued_swarm_fences_the_owner(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    paused = asyncio.Event()
    start, beat = SwarmRunner._start, Scheduler._extend_leases

    async def late_start(self: Any) -> None:  # the process pauses after adopting the swarm
        await paused.wait()
        await start(self)

    async def late_beat(self: Any) -> None:  # and its heartbeat with it
        await paused.wait()
        await beat(self)

    monkeypatch.setattr(SwarmRunner, "_start", late_start)
    monkeypatch.setattr(Scheduler, "_extend_leases", late_beat)
    h, close = await start_harness(make_settings(database_url, lease_seconds=0.5))
    try:
        sid = (await h.post(ONE)).json()["id"]  # adopted: queued, leased to this process
        await asyncio.sleep(0.8)  # past its lease
        r = await h.client.post(f"/swarms/{sid}/cancel")
        assert r.status_code == 202 and r.json()["status"] == "cancelled", r.text
        paused.set()  # the owner resumes
        seen: set[str] = set()
        for _ in range(60):
            seen.add((await h.client.get(f"/swarms/{sid}")).json()["status"])
            await asyncio.sleep(0.02)
        async with h.app.state.sessions() as s:
            types = list((await s.execute(select(Event.type).where(Event.swarm_id == sid)
                                          .order_by(Event.seq))).scalars())
        assert seen == {"cancelled"}, seen
        assert types == ["swarm.completed"], types
        assert h.sim_stats.calls == 0  # the fenced owner sent nothing
    finally:
        paused.set()
        await close()
