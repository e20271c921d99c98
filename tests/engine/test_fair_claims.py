"""SPEC §8 fair claims and per-tenant queue positions, on SQLite and PostgreSQL: the claim query
takes the oldest swarm of the tenant with the fewest running."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from app.db import create, leases, queries
from app.db.session import SessionFactory, make_db_engine, make_session_factory
from app.db.tables import Swarm
from app.db.types import utcnow
from app.engine.specs import build_swarm
from app.schemas import SwarmCreate
from tests.conftest import make_settings

LEASE_S = 30.0


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[SessionFactory]:
    engine = make_db_engine(database_url)
    yield make_session_factory(engine)
    await engine.dispose()


async def queue(sessions: SessionFactory, database_url: str, tenant: str, n: int,
                start_s: float) -> list[Swarm]:
    """n queued swarms of a tenant, one second apart from `start_s` (in the past)."""
    settings = make_settings(database_url)
    body = SwarmCreate.model_validate({"task": "t", "agents": [{"name": "a"}]})
    out = []
    async with sessions() as s, s.begin():
        for i in range(n):
            new = build_swarm(body, settings, tenant)
            new.swarm.created_at = utcnow() - timedelta(seconds=start_s - i)
            await create.insert_swarm(s, new.swarm, new.subtasks)
            out.append(new.swarm)
    return out


async def claim(sessions: SessionFactory, owner: str, limit: int) -> list[str]:
    async with sessions() as s, s.begin():
        return [c.swarm_id for c in await leases.claim_swarms(s, owner, LEASE_S, limit)]


async def test_claims_round_robin_across_tenants(sessions: SessionFactory,
                                                 database_url: str) -> None:
    # tenant a queued 12 swarms long before b queued one
    a = await queue(sessions, database_url, "a", 12, start_s=100)
    b = await queue(sessions, database_url, "b", 1, start_s=10)
    # two free slots: a's oldest and b's only swarm, not a's two oldest
    assert set(await claim(sessions, "w1", 2)) == {a[0].id, b[0].id}
    # a's backlog goes on once b has nothing queued
    assert await claim(sessions, "w1", 3) == [a[1].id, a[2].id, a[3].id]


async def test_a_tenant_with_fewer_running_goes_first(sessions: SessionFactory,
                                                      database_url: str) -> None:
    a = await queue(sessions, database_url, "a", 6, start_s=100)
    assert await claim(sessions, "w1", 2) == [a[0].id, a[1].id]  # a holds two now
    b = await queue(sessions, database_url, "b", 2, start_s=5)
    c = await queue(sessions, database_url, "c", 1, start_s=1)
    # b and c hold none: their oldest go before a's third, though younger; then b's second
    # (b would hold one) before a's third (a holds two)
    assert await claim(sessions, "w2", 4) == [b[0].id, c[0].id, b[1].id, a[2].id]


async def test_queue_position_counts_only_the_callers_queue(sessions: SessionFactory,
                                                            database_url: str) -> None:
    await queue(sessions, database_url, "a", 5, start_s=100)
    b = await queue(sessions, database_url, "b", 2, start_s=10)
    async with sessions() as s, s.begin():
        assert await queries.queue_position(s, b[0]) == 1
        assert await queries.queue_position(s, b[1]) == 2
