"""`follow_events` (the reader behind every event stream) on PostgreSQL, where each statement of
a READ COMMITTED transaction sees what was committed before it began: a swarm that completes
between the reader's two reads must still hand out its `swarm.completed`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import update

from app.api import follow
from app.db import create, queries
from app.db.session import SessionFactory
from app.db.tables import Event, Swarm
from app.engine.specs import build_swarm
from app.engine.waiters import SwarmNotifier
from app.schemas import SwarmCreate
from app.states import SwarmStatus
from tests.conftest import make_settings


async def test_a_completion_committed_between_the_reads_is_handed_out(
        pg_url: str, pg_sessions: SessionFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    new = build_swarm(SwarmCreate.model_validate({"task": "t", "agents": [{"name": "a"}]}),
                      make_settings(pg_url), "t1")
    await create.insert_swarm_alone(pg_sessions.kw["bind"], new.swarm, new.subtasks)
    swarm_id = new.swarm.id
    async with pg_sessions() as s, s.begin():
        s.add(Event(swarm_id=swarm_id, seq=1, type="swarm.status", data={"status": "running"}))
        await s.execute(update(Swarm).where(Swarm.id == swarm_id)
                        .values(status=SwarmStatus.running))

    real_get_status = queries.get_status
    completed = False

    async def complete_then_read(session: Any, sid: str, tenant: str | None) -> Any:
        """The runner's last commit lands just as the reader looks at the swarm's status."""
        nonlocal completed
        if not completed:
            completed = True
            async with pg_sessions() as s, s.begin():
                s.add(Event(swarm_id=swarm_id, seq=2, type="swarm.completed",
                            data={"status": "succeeded", "error": None, "cancelled": []}))
                await s.execute(update(Swarm).where(Swarm.id == swarm_id)
                                .values(status=SwarmStatus.succeeded))
        return await real_get_status(session, sid, tenant)

    monkeypatch.setattr(queries, "get_status", complete_then_read)

    async def read_all() -> list[tuple[int, str]]:
        return [(ev.seq, ev.type) async for ev in
                follow.follow_events(pg_sessions, SwarmNotifier(), swarm_id, "t1", after=1)]

    got = await asyncio.wait_for(read_all(), 10)
    assert completed
    assert got == [(2, "swarm.completed")]
