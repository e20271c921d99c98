"""The series the alert rules read (SPEC §5, §17): swarm_takeovers_total by how the last owner
let go, swarm_queue_oldest_age_seconds measured at scrape, and swarm_daily_budget_usd (absent
without a cap), on SQLite and PostgreSQL."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from app.db import create, leases
from app.db.session import SessionFactory, make_db_engine, make_session_factory
from app.db.tables import Swarm
from app.db.types import utcnow
from app.engine.specs import build_swarm
from app.schemas import SwarmCreate
from tests.conftest import Harness, make_settings, start_harness

LEASE_S = 30.0
BODY = {"task": "t", "agents": [{"name": "a"}]}


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[SessionFactory]:
    engine = make_db_engine(database_url)
    yield make_session_factory(engine)
    await engine.dispose()


async def queued(sessions: SessionFactory, database_url: str, age_s: float = 0) -> str:
    new = build_swarm(SwarmCreate.model_validate(BODY), make_settings(database_url), "t")
    new.swarm.created_at = utcnow() - timedelta(seconds=age_s)
    async with sessions() as s, s.begin():
        await create.insert_swarm(s, new.swarm, new.subtasks)
    return new.swarm.id


async def claim(sessions: SessionFactory, owner: str) -> list[leases.Claim]:
    async with sessions() as s, s.begin():
        return await leases.claim_swarms(s, owner, LEASE_S, 10)


async def expire(sessions: SessionFactory, swarm_id: str) -> None:
    async with sessions() as s, s.begin():
        await s.execute(update(Swarm).where(Swarm.id == swarm_id).values(
            lease_expires_at=utcnow() - timedelta(seconds=1)))


async def test_a_claim_says_how_the_last_owner_let_go(sessions: SessionFactory,
                                                       database_url: str) -> None:
    swarm_id = await queued(sessions, database_url)
    [first] = await claim(sessions, "w1")
    assert (first.swarm_id, first.takeover) == (swarm_id, None)  # nobody had it
    await expire(sessions, swarm_id)
    [second] = await claim(sessions, "w2")
    assert second.takeover == "lease_expired" and second.rescues == 1
    async with sessions() as s, s.begin():
        await leases.release_leases(s, "w2", [swarm_id])
    [third] = await claim(sessions, "w3")
    assert third.takeover == "released" and third.rescues == 1  # a release is no rescue


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


async def metrics_text(h: Harness) -> str:
    r = await h.client.get("/metrics")
    assert r.status_code == 200
    return r.text


async def test_a_takeover_is_counted_by_the_engine_that_takes_over(database_url: str) -> None:
    settings = make_settings(database_url)
    h, close = await start_harness(settings, run_engine=False)
    try:
        before = sample(await metrics_text(h), "swarm_takeovers_total", reason="lease_expired")
        assert before is not None  # exposed at zero from the start
        r = await h.post(BODY)
        swarm_id = r.json()["id"]
        async with h.app.state.sessions() as s, s.begin():  # a dead worker claimed it
            await s.execute(update(Swarm).where(Swarm.id == swarm_id).values(
                lease_owner="dead:1", lease_epoch=1,
                lease_expires_at=utcnow() - timedelta(seconds=1)))
    finally:
        await close()
    await h.release_db()
    h2, close2 = await start_harness(settings)
    try:
        assert (await h2.wait(swarm_id, timeout=20))["status"] == "succeeded"
        after = sample(await metrics_text(h2), "swarm_takeovers_total", reason="lease_expired")
    finally:
        await close2()
    assert after == before + 1


async def test_the_oldest_queued_swarm_age_is_read_at_scrape(database_url: str) -> None:
    h, close = await start_harness(make_settings(database_url), run_engine=False)
    try:
        assert sample(await metrics_text(h), "swarm_queue_oldest_age_seconds") == 0.0
        sessions = h.app.state.sessions
        await queued(sessions, database_url, age_s=600)
        await queued(sessions, database_url, age_s=30)
        age = sample(await metrics_text(h), "swarm_queue_oldest_age_seconds")
        assert age is not None and 600 <= age < 660, age
        async with sessions() as s, s.begin():  # the queue drains: the next scrape says so
            await s.execute(update(Swarm).values(status="cancelled"))
        assert sample(await metrics_text(h), "swarm_queue_oldest_age_seconds") == 0.0
        await h.app.state.db_engine.dispose()
        h.app.state.sessions = _unreachable
        assert math.isnan(sample(await metrics_text(h), "swarm_queue_oldest_age_seconds")
                          or 0.0)
    finally:
        await close()


def _unreachable() -> None:
    raise ConnectionRefusedError("the database is down")


async def test_the_daily_cap_is_a_series_only_when_set(sqlite_url: str, sqlite_template: Path,
                                                       tmp_path: Path) -> None:
    h, close = await start_harness(make_settings(sqlite_url, daily_budget_usd="250.5"))
    try:
        assert sample(await metrics_text(h), "swarm_daily_budget_usd") == 250.5
    finally:
        await close()
    # a second database, as a second process would have: this process's first one may still
    # be finishing a transaction its closed engine abandoned (seen once under load)
    second = tmp_path / "second.db"
    shutil.copy(sqlite_template, second)
    h, close = await start_harness(make_settings(f"sqlite+aiosqlite:///{second}"))
    try:
        assert "swarm_daily_budget_usd" not in await metrics_text(h)
    finally:
        await close()


def test_the_scraped_process_s_queue_age_wins_across_processes(tmp_path: Path) -> None:
    """Multiprocess mode: the age one process measured last is the figure, not the largest a
    process measured at some earlier scrape."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for age in (900.0, 0.0):  # an old scrape saw a long queue; the latest, an empty one
        subprocess.run([sys.executable, "-c", "from app import metrics; "
                        f"metrics.set_queue_oldest_age({age})"], env=env, check=True, timeout=60)
    out = subprocess.run([sys.executable, "-c", "from app import metrics; "
                          "print(metrics.render()[0].decode())"], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert sample(out, "swarm_queue_oldest_age_seconds") == 0.0
