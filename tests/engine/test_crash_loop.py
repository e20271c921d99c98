"""The crash-loop rule (SPEC §4): only consecutive fruitless takeovers count (no call of the
swarm settled since the previous claim); a settled call resets the count; a release is no
takeover; past SWARM_MAX_RESCUES the swarm fails `internal`, naming what was in flight."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select, update

from app.db import create, leases
from app.db.session import SessionFactory, make_db_engine, make_session_factory
from app.db.tables import GatewayCall, Swarm
from app.db.types import utcnow
from app.engine.specs import build_swarm
from app.schemas import SwarmCreate
from tests.conftest import make_settings, start_harness

BODY = {"task": "t", "agents": [{"name": "a"}], "synthesis": {"strategy": "none"},
        "max_tokens": 50}


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[SessionFactory]:
    engine = make_db_engine(database_url)
    yield make_session_factory(engine)
    await engine.dispose()


async def insert(sessions: SessionFactory, database_url: str) -> str:
    new = build_swarm(SwarmCreate.model_validate(BODY), make_settings(database_url), "default")
    async with sessions() as s, s.begin():
        await create.insert_swarm(s, new.swarm, new.subtasks)
    return new.swarm.id


async def set_row(sessions: SessionFactory, swarm_id: str, **values: Any) -> None:
    async with sessions() as s, s.begin():
        await s.execute(update(Swarm).where(Swarm.id == swarm_id).values(**values))


async def claim(sessions: SessionFactory, owner: str) -> leases.Claim:
    async with sessions() as s, s.begin():
        [one] = await leases.claim_swarms(s, owner, 30.0, 10)
    return one


async def expire(sessions: SessionFactory, swarm_id: str) -> None:
    await set_row(sessions, swarm_id, lease_expires_at=utcnow() - timedelta(seconds=1))


async def test_only_consecutive_fruitless_takeovers_count(sessions: SessionFactory,
                                                          database_url: str) -> None:
    swarm_id = await insert(sessions, database_url)
    assert (await claim(sessions, "w1")).rescues == 0
    counts = []
    for owner in ("w2", "w3"):  # owners that die before any call settles
        await expire(sessions, swarm_id)
        counts.append((await claim(sessions, owner)).rescues)
    assert counts == [1, 2]
    # w3 settles a call (its writes carry the epoch it holds), then dies: that takeover
    # was fruitful, and the count starts again
    await set_row(sessions, swarm_id, settled_epoch=3)
    await expire(sessions, swarm_id)
    assert (await claim(sessions, "w4")).rescues == 0
    await expire(sessions, swarm_id)
    assert (await claim(sessions, "w5")).rescues == 1
    async with sessions() as s, s.begin():  # a drain gives it back: no takeover
        await leases.release_leases(s, "w5", [swarm_id])
    released = await claim(sessions, "w6")
    assert (released.takeover, released.rescues) == ("released", 1)
    await set_row(sessions, swarm_id, settled_epoch=released.epoch)
    async with sessions() as s, s.begin():
        await leases.release_leases(s, "w6", [swarm_id])
    assert (await claim(sessions, "w7")).rescues == 0  # a settled call resets it, released too


async def dead_owner(sessions: SessionFactory, database_url: str, *, settled: bool) -> str:
    """A running swarm whose owner died at epoch 5 with `a` in flight, after two fruitless
    takeovers; `settled`: a call of it settled in that last epoch."""
    swarm_id = await insert(sessions, database_url)
    before = [{"epoch": 4, "in_flight": ["a"]}, {"epoch": 5, "in_flight": ["a"]}]
    await set_row(sessions, swarm_id, status="running", started_at=utcnow(),
                  lease_owner="dead", lease_epoch=5, rescues=2, takeovers=before,
                  settled_epoch=5 if settled else 3,
                  lease_expires_at=utcnow() - timedelta(seconds=1))
    async with sessions() as s, s.begin():
        s.add(GatewayCall(swarm_id=swarm_id, tenant="default", subtask_name="a", model="kimi-k2.5",
                          idempotency_key=f"{swarm_id}:a:1", attempt=1, outcome="in_flight",
                          reserved_usd=Decimal("0.01"), cost_usd=Decimal(0), latency_ms=0.0))
    return swarm_id


async def test_the_third_fruitless_takeover_fails_the_swarm_a_fruitful_one_resets(
        sessions: SessionFactory, database_url: str) -> None:
    looping = await dead_owner(sessions, database_url, settled=False)
    progressing = await dead_owner(sessions, database_url, settled=True)
    h, close = await start_harness(make_settings(database_url, max_rescues=3))
    try:
        failed, done = await h.wait(looping), await h.wait(progressing)
    finally:
        await close()
        await h.release_db()
    assert failed["status"] == "failed" and failed["error"]["code"] == "internal", failed
    assert failed["error"]["details"]["rescues"] == 3
    assert failed["error"]["details"]["takeovers"] == [
        {"epoch": 4, "in_flight": ["a"]}, {"epoch": 5, "in_flight": ["a"]},
        {"epoch": 6, "in_flight": ["a"]}]
    assert [s["status"] for s in failed["subtasks"]] != ["succeeded"]  # never called again
    assert done["status"] == "succeeded", done
    async with sessions() as s:
        row = (await s.execute(select(Swarm.rescues, Swarm.takeovers, Swarm.settled_epoch)
                               .where(Swarm.id == progressing))).one()
    # the takeover reset the count, and the answer it got settled in its own epoch
    assert (row.rescues, row.takeovers, row.settled_epoch) == (0, [], 6)
