"""Takeover of swarms a dead process left half-way, and cancels that race a claim."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from app.db import leases
from app.db.session import db_now
from app.db.tables import Event, Subtask, Swarm
from app.db.types import utcnow
from tests.conftest import make_settings, start_harness
from tests.helpers import until

BODY = {"task": "t", "agents": [{"name": "a"}, {"name": "b"}]}


async def test_takeover_while_synthesizing_finishes_the_swarm(database_url: str) -> None:
    settings = make_settings(database_url)
    h, close = await start_harness(settings)
    try:
        first = await h.run(BODY)  # a finished run gives real worker rows to rewind to
    finally:
        await close()
    swarm_id = first["id"]
    # rewind to "a process died while synthesizing": synthesizer running, lease expired
    async with h.app.state.sessions() as s, s.begin():
        await s.execute(update(Subtask).where(Subtask.swarm_id == swarm_id,
                                              Subtask.name == "@synthesizer")
                        .values(status="running", output=None, finished_at=None))
        await s.execute(update(Swarm).where(Swarm.id == swarm_id).values(
            status="synthesizing", finished_at=None, result=None, lease_owner="dead:1",
            lease_expires_at=utcnow() - timedelta(seconds=1)))
        await s.execute(Event.__table__.delete().where(
            Event.swarm_id == swarm_id, Event.type == "swarm.completed"))
        await s.execute(update(Swarm).where(Swarm.id == swarm_id).values(
            event_seq=Swarm.event_seq - 1))
    await h.release_db()
    h2, close2 = await start_harness(settings)
    try:
        data = await h2.wait(swarm_id, timeout=10)
    finally:
        await close2()
    assert data["status"] == "succeeded", data["error"]
    assert data["result"]
    workers = [s for s in data["subtasks"] if s["kind"] == "worker"]
    assert all(w["attempts"] == 1 for w in workers)  # never called again


async def test_cancel_of_a_claimed_queued_swarm_is_delivered_to_its_owner(
        database_url: str) -> None:
    settings = make_settings(database_url)
    h, close = await start_harness(settings, run_engine=False)
    try:
        swarm_id = (await h.post(BODY)).json()["id"]
        async with h.app.state.sessions() as s, s.begin():  # another process claimed it
            await leases.claim_new(s, swarm_id, "ghost:1", 0.5)
        r = await h.client.post(f"/swarms/{swarm_id}/cancel")
        assert r.status_code == 202
        assert r.json()["status"] == "queued"  # not cancelled behind its owner's back
    finally:
        await close()
    async def lease_expired() -> bool:  # the owner died: its lease runs out
        async with h.app.state.sessions() as s:
            expires = (await s.execute(select(Swarm.lease_expires_at)
                                       .where(Swarm.id == swarm_id))).scalar_one()
            return bool(expires < await db_now(s))

    await until(lease_expired, 5, "the ghost's lease to expire")
    await h.release_db()
    h2, close2 = await start_harness(settings)
    try:
        data = await h2.wait(swarm_id, timeout=10)
        async with h2.app.state.sessions() as s:
            seqs = list((await s.execute(select(Event.seq).where(Event.swarm_id == swarm_id)
                                         .order_by(Event.seq))).scalars())
    finally:
        await close2()
    assert data["status"] == "cancelled"
    assert seqs == list(range(1, len(seqs) + 1))
