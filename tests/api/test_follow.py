"""`follow_events` (the reader behind every event stream) on PostgreSQL, where each statement of
a READ COMMITTED transaction sees what was committed before it began: a swarm that completes
between the reader's two reads must still hand out its `swarm.completed`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import update

from app.aio import wait_for
from app.api import follow
from app.db import create, queries
from app.db.session import SessionFactory
from app.db.tables import Event, Swarm
from app.engine.specs import build_swarm
from app.engine.waiters import SwarmNotifier
from app.schemas import SwarmCreate
from app.states import SwarmStatus
from tests.conftest import make_settings
from tests.helpers import until


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

    got = await wait_for(read_all(), 10)
    assert completed
    assert got == [(2, "swarm.completed")]


async def _swarm_with_events(url: str, sessions: SessionFactory, seqs: list[int],
                             status: SwarmStatus) -> str:
    new = build_swarm(SwarmCreate.model_validate({"task": "t", "agents": [{"name": "a"}]}),
                      make_settings(url), "t1")
    await create.insert_swarm_alone(sessions.kw["bind"], new.swarm, new.subtasks)
    await _add_events(sessions, new.swarm.id, seqs, status)
    return new.swarm.id


async def _add_events(sessions: SessionFactory, swarm_id: str, seqs: list[int],
                      status: SwarmStatus) -> None:
    async with sessions() as s, s.begin():
        for seq in seqs:
            kind = "swarm.completed" if status.terminal and seq == max(seqs) else "swarm.status"
            s.add(Event(swarm_id=swarm_id, seq=seq, type=kind, data={"status": status.value}))
        await s.execute(update(Swarm).where(Swarm.id == swarm_id).values(status=status))


async def test_a_missing_number_is_waited_for_and_handed_out_in_order(
        pg_url: str, pg_sessions: SessionFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused result's failure commits under its number after later events: a reader that
    sees 3 without 2 waits for 2 and hands out 1, 2, 3."""
    monkeypatch.setattr(follow, "HOLE_S", 30.0)  # only 2's commit lets the reader on
    notifier = SwarmNotifier()
    swarm_id = await _swarm_with_events(pg_url, pg_sessions, [1, 3], SwarmStatus.running)
    got: list[int] = []

    async def read() -> None:
        async for ev in follow.follow_events(pg_sessions, notifier, swarm_id, "t1"):
            got.append(ev.seq)

    reader = asyncio.create_task(read())
    await until(lambda: got, 5, "the first event")  # read with 3: the hole is seen
    await _add_events(pg_sessions, swarm_id, [2], SwarmStatus.running)
    notifier.notify(swarm_id)
    await _add_events(pg_sessions, swarm_id, [4], SwarmStatus.succeeded)
    notifier.notify(swarm_id)
    await wait_for(reader, 10)
    assert got == [1, 2, 3, 4]


async def test_a_number_never_committed_is_skipped_after_a_while(
        pg_url: str, pg_sessions: SessionFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "HOLE_S", 0.2)
    swarm_id = await _swarm_with_events(pg_url, pg_sessions, [1, 3], SwarmStatus.succeeded)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    got = [ev.seq async for ev in
           follow.follow_events(pg_sessions, SwarmNotifier(), swarm_id, "t1")]
    assert got == [1, 3] and loop.time() - t0 >= 0.2
