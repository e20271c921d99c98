"""A swarm's creation as one PostgreSQL statement (`create.insert_swarm_alone`): the swarm's row,
its subtasks, its NOTIFY and its queue position, atomic, in autocommit; and `POST /swarms` takes
that path exactly when nothing else is written with the swarm (no Idempotency-Key, no quota
checked in its transaction)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event, select

from app.api import swarms
from app.db import create, creation_statement
from app.db.notify import QUEUED
from app.db.session import (
    SessionFactory,
    asyncpg_dsn,
    db_now,
)
from app.db.tables import GatewayCall, Subtask, Swarm
from app.db.types import utcnow
from app.engine.specs import NewSwarm, build_swarm
from app.schemas import SwarmCreate
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import error_of
from tests.procs import Db

AGENTS = {"task": "t", "agents": [{"name": "a"}, {"name": "b", "depends_on": ["a"]},
                                  {"name": "c"}], "limits": {"budget_usd": "2.5"}}
NO_QUOTAS = "[defaults]\nmax_agents = 100\n"  # no bucket, no active or daily limit to check


@pytest.fixture
def sessions(pg_sessions: SessionFactory) -> SessionFactory:
    return pg_sessions


def new_swarm(url: str, tenant: str = "t1", body: dict[str, Any] = AGENTS,
              age_s: float = 0.0) -> NewSwarm:
    new = build_swarm(SwarmCreate.model_validate(body), make_settings(url), tenant)
    new.swarm.created_at = utcnow() - timedelta(seconds=age_s)
    return new


async def insert_alone(sessions: SessionFactory, new: NewSwarm, **kw: Any) -> int | None:
    return await create.insert_swarm_alone(sessions.kw["bind"], new.swarm, new.subtasks, **kw)


@pytest.fixture
async def heard(pg_url: str) -> AsyncIterator[list[str]]:
    """Payloads of `swarm_queued` notifications, from a listener of its own."""
    out: list[str] = []
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    await conn.add_listener(QUEUED, lambda *args: out.append(args[3]))
    yield out
    await conn.close()


async def test_one_statement_stores_the_swarm_its_subtasks_and_wakes_the_workers(
        sessions: SessionFactory, pg_url: str, heard: list[str]) -> None:
    for age in (30, 20):  # two of the tenant's queue before it, one of another tenant's
        await insert_alone(sessions, new_swarm(pg_url, age_s=age), position=True)
    await insert_alone(sessions, new_swarm(pg_url, tenant="t2", age_s=25))
    new = new_swarm(pg_url)
    assert await insert_alone(sessions, new, position=True) == 3
    async with sessions() as s:
        row = (await s.execute(select(Swarm).where(Swarm.id == new.swarm.id))).scalar_one()
        subs = (await s.execute(select(Subtask).where(Subtask.swarm_id == new.swarm.id)
                                .order_by(Subtask.position))).scalars().all()
    assert (row.tenant, row.status, row.spec, row.budget_usd, row.created_at, row.lease_owner) \
        == ("t1", "queued", new.swarm.spec, new.swarm.budget_usd, new.swarm.created_at, None)
    assert [(s.name, s.position, s.depends_on, s.prompt) for s in subs] == \
        [(s.name, s.position, s.depends_on, s.prompt) for s in new.subtasks]
    await _until(lambda: new.swarm.id in heard)


MIXED = {"task": "t", "synthesis": {"strategy": "synthesize"}, "agents": [
    {"name": "a", "model": "gpt-4.1", "temperature": 0.2, "max_tokens": 100, "weight": 2.0},
    {"name": "b", "prompt": "p", "depends_on": ["a"]},
    {"name": "c", "system_prompt": "s", "temperature": 1, "max_tokens": 100},
    {"name": "d", "model": "deepseek-v3.2", "max_turns": 3, "depends_on": ["a", "c"]}]}


@pytest.mark.parametrize("body", [AGENTS, MIXED, {"task": "t", "agents": [{"name": "solo"}]}],
                         ids=["alike", "mixed", "one"])
async def test_every_subtask_column_is_stored_as_built(
        sessions: SessionFactory, pg_url: str, body: dict[str, Any]) -> None:
    """The columns every subtask has alike go once, not per row: each row is still stored
    with every column as it was built, whichever columns differ."""
    new = new_swarm(pg_url, body=body)
    await insert_alone(sessions, new, claim_for="w1", lease_s=30)
    async with sessions() as s:
        subs = (await s.execute(select(Subtask).where(Subtask.swarm_id == new.swarm.id)
                                .order_by(Subtask.position))).scalars().all()
    stored = [create.insert_row(x) for x in subs]
    assert stored == [create.insert_row(x) for x in new.subtasks]
    assert len({(x["model"], x["temperature"], x["kind"]) for x in stored}) == \
        len({(x.model, x.temperature, x.kind) for x in new.subtasks})


def first_calls(new: NewSwarm, models: list[str]) -> list[dict[str, Any]]:
    """`gateway_calls` rows in flight for the first subtasks, as a first wave writes them: a
    model (and so the worst case) per row, the rest of a row's values alike or not."""
    at = utcnow()
    return [{"swarm_id": new.swarm.id, "tenant": new.swarm.tenant, "subtask_name": sub.name,
             "model": model, "idempotency_key": f"{new.swarm.id}:{sub.name}:1", "attempt": 1,
             "http_status": None, "outcome": "in_flight", "prompt_tokens": 90 + len(model),
             "completion_tokens": 200, "cached_tokens": 0, "latency_ms": 0.0,
             "cost_usd": Decimal(0), "reserved_usd": Decimal("0.0005") * (1 + len(model)),
             "at_bound": True, "created_at": at + timedelta(microseconds=k)}
            for k, (sub, model) in enumerate(zip(new.subtasks, models, strict=False))]


@pytest.mark.parametrize("models", [["kimi-k2.5"] * 3, ["kimi-k2.5", "gpt-4.1", "kimi-k2.5"],
                                    ["gpt-4.1"]], ids=["alike", "mixed", "one"])
async def test_every_first_call_column_is_stored_as_built(
        sessions: SessionFactory, pg_url: str, models: list[str]) -> None:
    """The columns every first call has alike go once, not per row (as the subtasks'):
    each ledger row is still stored with every column as it was built."""
    new = new_swarm(pg_url)
    rows = first_calls(new, models)
    await insert_alone(sessions, new, claim_for="w1", lease_s=30, ahead=create.Ahead(rows))
    async with sessions() as s:
        stored = (await s.execute(select(GatewayCall).where(
            GatewayCall.swarm_id == new.swarm.id).order_by(GatewayCall.subtask_name)
        )).scalars().all()
    assert [{k: getattr(call, k) for k in rows[0]} for call in stored] == rows


def test_values_alike_only_as_a_document_would_store_them() -> None:
    alike = creation_statement._alike
    assert alike(None, None) and alike("x", "x") and alike(1, 1) and alike([], [])
    assert not alike(1, 1.0) and not alike(1, True) and not alike(0, False)
    assert not alike(["a"], ["a"]) and not alike({"k": 1}, {"k": True})
    shared = ["a"]
    assert alike(shared, shared)


async def test_a_claimed_swarm_is_leased_by_the_database_clock_and_wakes_nobody(
        sessions: SessionFactory, pg_url: str, heard: list[str]) -> None:
    await insert_alone(sessions, new_swarm(pg_url, age_s=10))  # queued before it: not counted
    new = new_swarm(pg_url)
    async with sessions() as s:
        before = await db_now(s)
    assert await insert_alone(sessions, new, claim_for="w1", lease_s=30, position=True) == 1
    async with sessions() as s:
        after = await db_now(s)
        row = (await s.execute(select(Swarm).where(Swarm.id == new.swarm.id))).scalar_one()
    assert (row.lease_owner, row.lease_epoch) == ("w1", 1)
    assert row.lease_expires_at == new.swarm.lease_expires_at  # what the caller was told
    expires = row.lease_expires_at
    assert expires is not None
    assert before + timedelta(seconds=30) <= expires <= after + timedelta(seconds=30)
    await asyncio.sleep(0.3)
    assert new.swarm.id not in heard  # only the unclaimed one woke the workers
    assert len(heard) == 1


async def test_a_refused_statement_stores_nothing(sessions: SessionFactory,
                                                  pg_url: str) -> None:
    new = new_swarm(pg_url)
    new.subtasks[2].name = new.subtasks[0].name  # (swarm_id, name) is unique: refused
    with pytest.raises(asyncpg.UniqueViolationError):
        await insert_alone(sessions, new)
    async with sessions() as s:  # the swarm's row went with its subtasks'
        assert (await s.execute(select(Swarm.id).where(Swarm.id == new.swarm.id))).first() \
            is None
        assert await insert_alone(sessions, new_swarm(pg_url), position=True) == 1  # pool fine


async def begins(h: Harness, json_body: dict[str, Any] = AGENTS, **kw: Any
                 ) -> tuple[int, dict[str, Any]]:
    """Transactions the app's pool began for one `POST /swarms` (the ASGI transport runs it in
    this task), and its answer."""
    count, request = 0, asyncio.current_task()

    def began(_conn: Any) -> None:
        nonlocal count
        if asyncio.current_task() is request:  # not the engine's tasks (its runner)
            count += 1

    engine = h.app.state.db_engine.sync_engine
    event.listen(engine, "begin", began)
    try:
        r = await h.post(json_body, **kw)
    finally:
        event.remove(engine, "begin", began)
    assert r.status_code == 202, r.text
    return count, r.json()


@pytest.mark.parametrize("engine", [False, True], ids=["queued", "adopted"])
async def test_post_is_one_statement_when_nothing_else_is_written(pg_url: str, tmp_path: Path,
                                                                  engine: bool) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(NO_QUOTAS)
    h, close = await start_harness(make_settings(pg_url, tenants_file=str(tenants)),
                                   run_engine=engine)
    try:
        n, created = await begins(h)
        assert n == 0  # no BEGIN: the statement was its own transaction
        assert created["queue_position"] == 1
        assert len(created["subtasks"]) == 4  # and the synthesizer
        seen = (await h.client.get(f"/swarms/{created['id']}")).json()
        if not engine:  # the answer built from memory is what is stored
            assert seen == created
        n, keyed = await begins(h, headers={"Idempotency-Key": "k1"})
        assert n == 0  # with a key too: its lookup and the insert are a statement each
        assert (await h.post(AGENTS, headers={"Idempotency-Key": "k1"})).json()["id"] \
            == keyed["id"]
    finally:
        await close()


async def test_a_wide_swarms_answer_is_built_while_its_statement_runs(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From `_WIDE` subtasks the answer's fields are built while the creation's statement is at
    the database (in a task of its own): still one statement, no BEGIN, and the answer is
    what is stored, its queue position the statement's."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(NO_QUOTAS)
    h, close = await start_harness(make_settings(pg_url, tenants_file=str(tenants)),
                                   run_engine=False)
    began: list[str] = []
    request = asyncio.current_task()  # the ASGI transport runs the POST in this task

    def on_begin(_conn: Any) -> None:  # the POST's, or its statement's task's
        task = asyncio.current_task()
        coro = task.get_coro() if task is not None else None
        if task is request or getattr(coro, "__name__", "") == "insert_swarm_alone":
            began.append(str(task))

    engine = h.app.state.db_engine.sync_engine
    event.listen(engine, "begin", on_begin)

    def not_after(*_: Any) -> bytes:
        raise AssertionError("the wide swarm's answer was built after its statement")

    monkeypatch.setattr(swarms, "swarm_json", not_after)
    try:
        wide = {"task": "t", "agents": [{"name": f"a{i}"} for i in range(swarms._WIDE)]}
        first = (await h.post(wide)).json()
        r = await h.post(wide)
        assert r.status_code == 202, r.text
        created = r.json()
        assert began == []
        assert (first["queue_position"], created["queue_position"]) == (1, 2)
        assert created == (await h.client.get(f"/swarms/{created['id']}")).json()
    finally:
        event.remove(engine, "begin", on_begin)
        await close()


async def test_post_with_quotas_to_check_is_one_statement_too(pg_url: str) -> None:
    """SPEC §8's defaults (a bucket, a daily cap) are checked in the creation's statement
    (migration 0014's `tenant_admit`): no transaction, and the token is taken; with an
    Idempotency-Key the lookup, the insert and the checks share one."""
    h, close = await start_harness(make_settings(pg_url), run_engine=False)
    try:
        n, created = await begins(h)
        assert n == 0 and created["status"] == "queued"
        limits = h.app.state.settings.tenant_limits("default")
        (tokens,) = await Db(pg_url).fetch("SELECT tokens FROM tenant_buckets")
        assert limits.bucket_size - 1.5 < tokens[0] < limits.bucket_size - 0.5  # one taken
        n, _ = await begins(h, headers={"Idempotency-Key": "k1"})
        assert n == 0
    finally:
        await close()


@pytest.mark.parametrize("engine", [False, True], ids=["queued", "adopted"])
async def test_a_keyed_post_frees_an_expired_key_in_its_statement(pg_url: str,
                                                                  engine: bool) -> None:
    """SPEC §3's Idempotency-Key on the one-statement path, with SPEC §8's quotas checked in
    it (and, adopted, the local claim): a live key answers its swarm (another body: 422); a
    key older than SWARM_IDEMPOTENCY_TTL_S is freed by the next creation's statement, and the
    old swarm keeps its data."""
    h, close = await start_harness(make_settings(pg_url), run_engine=engine)
    try:
        key = {"Idempotency-Key": "k-expire"}
        first = await h.post(AGENTS, headers=key)
        assert first.status_code == 202, first.text
        again = await h.post(AGENTS, headers=key)
        assert again.status_code == 202 and again.json()["id"] == first.json()["id"]
        assert again.headers["location"] == f"/swarms/{first.json()['id']}"
        error_of(await h.post({**AGENTS, "task": "other"}, headers=key), 422,
                 "idempotency_key_reused")
        ttl = h.app.state.settings.idempotency_ttl_s
        await Db(pg_url).fetch("UPDATE swarms SET created_at = created_at - make_interval("
                               "secs => $1) WHERE id = $2", ttl + 60, first.json()["id"])
        other = await h.post({**AGENTS, "task": "other"}, headers=key)  # the key is free
        assert other.status_code == 202, other.text
        assert other.json()["id"] != first.json()["id"]
        rows = await Db(pg_url).fetch("SELECT id, idempotency_key, task FROM swarms ORDER BY "
                                      "created_at")
        assert [(r["id"], r["idempotency_key"], r["task"]) for r in rows] == [
            (first.json()["id"], None, "t"), (other.json()["id"], "k-expire", "other")]
        assert (await h.post({**AGENTS, "task": "other"}, headers=key)).json()["id"] \
            == other.json()["id"]
    finally:
        await close()


async def _until(cond: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "not heard"
        await asyncio.sleep(0.02)


ODD = {"task": "t \u00e9\U0001F600 \"quoted\" \\ back", "metadata": {
    # (a float past ~1e17 comes back from jsonb as an integer of its 17 digits: as before)
    "big": 123456789012345678901234567890, "tiny": 5e-324, "float": -1.25e-7,
    "nested": {"list": [1, "two", None, True, {"x": []}]}, "empty": {}, "q'uote": "'",
    "line \u2028 separator": "a\u2028b"},
    "agents": [{"name": "a.b-c_1", "prompt": "\U0001F600 [[sim latency_ms=0]]"},
               {"name": "z", "depends_on": ["a.b-c_1"], "temperature": 0.7}]}


async def test_odd_values_are_stored_as_sent(pg_url: str, tmp_path: Path) -> None:
    """What the one statement's JSON documents carry (big integers, extreme floats, quotes,
    astral characters) is stored and read back as the API was given it."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(NO_QUOTAS)
    h, close = await start_harness(make_settings(pg_url, tenants_file=str(tenants)),
                                   run_engine=False)
    try:
        n, created = await begins(h, json_body=ODD)
        assert n == 0
        seen = (await h.client.get(f"/swarms/{created['id']}")).json()
        assert seen == created
        assert seen["metadata"] == ODD["metadata"] and seen["task"] == ODD["task"]
        assert [s["name"] for s in seen["subtasks"]][:2] == ["a.b-c_1", "z"]
    finally:
        await close()
