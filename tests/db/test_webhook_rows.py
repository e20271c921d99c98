"""A delivery's attempt is recorded on the delivery it claimed: when the swarm's webhook was
replaced while the attempt was in flight (an approval notice, then the decision's end), the
new delivery stays due. SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import insert, select

from app.db import approval, create
from app.db import webhooks as repo
from app.db.session import SessionFactory, make_db_engine, make_session_factory
from app.db.tables import Webhook, WebhookAttempt
from app.db.types import utcnow
from app.engine.specs import build_swarm
from app.schemas import SwarmCreate
from app.states import WebhookState
from tests.conftest import make_settings


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[SessionFactory]:
    engine = make_db_engine(database_url)
    yield make_session_factory(engine)
    await engine.dispose()


async def swarm_with_delivery(sessions: SessionFactory, database_url: str) -> str:
    body = SwarmCreate.model_validate({"task": "t", "agents": [{"name": "a"}]})
    new = build_swarm(body, make_settings(database_url), "t1")
    async with sessions() as s, s.begin():
        await create.insert_swarm(s, new.swarm, new.subtasks)
        await s.execute(insert(Webhook).values(**repo.new_delivery(
            new.swarm.id, "t1", "https://hooks.example/notice", utcnow() - timedelta(seconds=1))))
    return new.swarm.id


async def test_an_attempt_never_settles_the_delivery_that_replaced_its_own(
        sessions: SessionFactory, database_url: str) -> None:
    swarm_id = await swarm_with_delivery(sessions, database_url)
    async with sessions() as s, s.begin():
        [notice] = await repo.claim_due(s, 5, 30.0, 4, {})
    # the notice is being sent; the swarm is decided meanwhile and its end becomes due
    async with sessions() as s, s.begin():
        await approval.replace_webhook(s, repo.new_delivery(
            swarm_id, "t1", "https://hooks.example/end", utcnow()))
    async with sessions() as s, s.begin():
        state = await repo.record_attempt(s, notice, 204, None, 3.0, 1.0, 3600.0)
    assert state is WebhookState.delivered  # the notice was delivered ...
    async with sessions() as s:
        row = (await s.execute(select(Webhook).where(Webhook.swarm_id == swarm_id))).scalar_one()
        attempts = (await s.execute(select(WebhookAttempt.status_code).where(
            WebhookAttempt.swarm_id == swarm_id))).scalars().all()
    # ... and the end's delivery is still due, untouched
    assert (row.url, row.state, row.attempts) == (
        "https://hooks.example/end", WebhookState.pending, 0)
    assert attempts == [204]
    async with sessions() as s, s.begin():
        [end] = await repo.claim_due(s, 5, 30.0, 4, {})
    assert end.url == "https://hooks.example/end"


async def test_an_attempt_settles_its_own_delivery(
        sessions: SessionFactory, database_url: str) -> None:
    swarm_id = await swarm_with_delivery(sessions, database_url)
    async with sessions() as s, s.begin():
        [hook] = await repo.claim_due(s, 5, 30.0, 4, {})
    async with sessions() as s, s.begin():
        assert await repo.record_attempt(s, hook, 500, "HTTP 500", 3.0, 1.0, 3600.0) is (
            WebhookState.pending)
    async with sessions() as s, s.begin():
        [again] = await repo.claim_due(s, 5, 30.0, 4, {}) or [None]
    assert again is None  # due again in a second, not now
    async with sessions() as s:
        row = (await s.execute(select(Webhook).where(Webhook.swarm_id == swarm_id))).scalar_one()
    assert (row.state, row.attempts) == (WebhookState.pending, 1)
    async with sessions() as s, s.begin():
        assert await repo.record_attempt(s, row, 204, None, 3.0, 1.0, 3600.0) is (
            WebhookState.delivered)
    async with sessions() as s:
        row = (await s.execute(select(Webhook).where(Webhook.swarm_id == swarm_id))).scalar_one()
    assert (row.state, row.attempts) == (WebhookState.delivered, 2)
