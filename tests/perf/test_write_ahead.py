"""Spend survives crashes (SPEC §4): every attempt is in the ledger before it is sent, a
takeover bills what a dead owner had in flight at its reservation, and answers that do not
decode (10,000 levels of nesting) are bad answers, never a crash. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import insert, select, update

from app.aio import wait_for
from app.db import leases
from app.db.changes import SwarmWrite
from app.db.tables import DailyReservation, DailySpend, GatewayCall, Subtask, Swarm
from app.db.tenant_tables import TenantDailySpend
from app.db.types import utcnow
from app.engine.writer import StateWriter
from app.gateway.chat import ChatRequest
from app.gateway.client import GatewayClient
from app.pricing import PriceTable
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent, until

PRICES = PriceTable.builtin()
SLOW = "[[sim latency_ms=1500]]"


async def rows(h: Harness, swarm_id: str) -> list[GatewayCall]:
    async with h.app.state.sessions() as s:
        return list((await s.execute(select(GatewayCall).where(GatewayCall.swarm_id == swarm_id)
                                     .order_by(GatewayCall.attempt))).scalars())


def unknown_count(model: str = "kimi-k2.5") -> float:
    value = REGISTRY.get_sample_value("swarm_gateway_requests_total",
                                      {"model": model, "outcome": "unknown"})
    return value or 0.0


def unresolved_metric(model: str = "kimi-k2.5") -> float:
    return REGISTRY.get_sample_value("swarm_spend_unresolved_usd_total", {"model": model}) or 0.0


async def test_an_attempt_is_in_the_ledger_before_it_is_sent(harness: Harness) -> None:
    body = {"task": "t", "agents": [agent("a", SLOW)], "synthesis": {"strategy": "none"}}
    swarm_id = (await harness.post(body)).json()["id"]

    async def on_the_wire() -> bool:
        return bool(harness.sim_stats.in_flight)

    await until(on_the_wire, 10, "the call on the wire", every=0.02)
    # the gateway has the request: its row was committed before it was sent
    (ahead,) = await rows(harness, swarm_id)
    assert (ahead.outcome, ahead.attempt, ahead.cost_usd) == ("in_flight", 1, Decimal(0))
    assert ahead.reserved_usd > 0 and ahead.completion_tokens == 1500  # the worst case
    data = await harness.wait(swarm_id)
    (settled,) = await rows(harness, swarm_id)  # the same row, settled by the answer
    assert (settled.id, settled.outcome, settled.http_status) == (ahead.id, "ok", 200)
    assert 0 < settled.cost_usd <= settled.reserved_usd == ahead.reserved_usd
    assert Decimal(data["usage"]["cost_usd"]) == settled.cost_usd
    assert data["usage"]["unresolved_usd"] == "0"


async def test_takeover_bills_a_dead_owners_attempt_at_its_reservation(database_url: str
                                                                       ) -> None:
    """A process died with attempt 1 of `a` on the wire (its row written ahead, its answer
    lost). The next owner records it `unknown` at its reservation in the swarm's usage, the
    subtask's, /usage and the daily cap, and sends attempt 2 under the same key."""
    settings = make_settings(database_url, daily_budget_usd=Decimal("5"))
    body = {"task": "t", "agents": [agent("a")], "synthesis": {"strategy": "none"}}
    h, close = await start_harness(settings, run_engine=False)
    try:
        swarm_id = (await h.post(body)).json()["id"]
    finally:
        await close()
    reserved = PRICES["kimi-k2.5"].worst_case(400, 1500)
    now = utcnow()
    async with h.app.state.sessions() as s, s.begin():  # what the dead owner left behind
        await leases.claim_new(s, swarm_id, "dead:1", 30)
        await s.execute(update(Swarm).where(Swarm.id == swarm_id).values(
            status="running", started_at=now, lease_expires_at=now - timedelta(seconds=1),
            reserved_usd=reserved, event_seq=0))
        await s.execute(update(Subtask).where(Subtask.swarm_id == swarm_id).values(
            status="running", started_at=now))  # attempts: counted only in its memory
        await s.execute(insert(GatewayCall).values(
            swarm_id=swarm_id, tenant="default", subtask_name="a", model="kimi-k2.5",
            idempotency_key=f"{swarm_id}:a:1", attempt=1, outcome="in_flight",
            prompt_tokens=400, completion_tokens=1500, cost_usd=Decimal(0),
            reserved_usd=reserved, latency_ms=0.0, created_at=now))
        await s.execute(insert(DailySpend).values(day=now.astimezone(UTC).date(),
                                                  spent_usd=Decimal(0)))
        # its daily reservation, which outlives it (expired, it still holds its day's money)
        await s.execute(insert(DailyReservation).values(
            id="d" * 32, day=now.astimezone(UTC).date(), owner="dead:1", amount=reserved,
            expires_at=now - timedelta(seconds=1)))
    await h.release_db()
    before = (unknown_count(), unresolved_metric())
    h2, close2 = await start_harness(settings)
    try:
        data = await h2.wait(swarm_id)
        usage = (await h2.client.get("/usage")).json()["total"]
        ledger = await rows(h2, swarm_id)
        async with h2.app.state.sessions() as s:
            daily = (await s.execute(select(DailySpend.spent_usd))).scalar_one()
            holding = (await s.execute(select(DailyReservation.amount))).scalars().all()
    finally:
        await close2()
    assert data["status"] == "succeeded", data["error"]
    assert [(r.attempt, r.outcome) for r in ledger] == [(1, "unknown"), (2, "ok")]
    assert {r.idempotency_key for r in ledger} == {f"{swarm_id}:a:1"}
    assert ledger[0].cost_usd == reserved
    answered = ledger[1].cost_usd
    assert Decimal(data["usage"]["cost_usd"]) == reserved + answered
    assert Decimal(data["usage"]["unresolved_usd"]) == reserved
    assert data["usage"]["gateway_calls"] == 2
    assert data["usage"]["prompt_tokens"] == 400 + ledger[1].prompt_tokens
    (a,) = data["subtasks"]
    assert a["attempts"] == 2 and Decimal(a["usage"]["cost_usd"]) == reserved + answered
    assert [Decimal(usage[k]) for k in ("cost_usd", "unresolved_usd", "settled_usd")] == [
        reserved + answered, reserved, answered]
    assert usage["gateway_calls"] == 2
    # the daily cap counts both: the answered one spent, the lost one held by its reservation
    assert (daily, holding) == (answered, [reserved])
    assert unknown_count() == before[0] + 1
    # a float counter: exact to the last bit only by luck
    assert unresolved_metric() - before[1] == pytest.approx(float(reserved), abs=1e-12)
    stats = (await h2.stats())["by_key"][f"{swarm_id}:a:1"]
    assert stats["calls"] == 1  # the dead owner's attempt was not this simulator's


async def test_a_call_cut_off_by_a_cancel_is_recorded_at_its_reservation(harness: Harness
                                                                         ) -> None:
    body = {"task": "t", "agents": [agent("a", SLOW)], "synthesis": {"strategy": "none"}}
    swarm_id = (await harness.post(body)).json()["id"]

    async def on_the_wire() -> bool:
        return bool(harness.sim_stats.in_flight)

    await until(on_the_wire, 10, "the call on the wire", every=0.02)
    assert (await harness.client.post(f"/swarms/{swarm_id}/cancel")).status_code == 202
    data = await harness.wait(swarm_id)
    assert data["status"] == "cancelled"
    (row,) = await rows(harness, swarm_id)
    # sent, answer never read: the gateway may bill it, so it counts at its worst case
    assert row.outcome == "unknown" and row.cost_usd == row.reserved_usd > 0
    assert Decimal(data["usage"]["cost_usd"]) == Decimal(data["usage"]["unresolved_usd"]) \
        == row.cost_usd


async def test_an_answer_is_in_the_tenants_day_before_the_swarm_answers(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A swarm ended while an answer's cost is being settled against the tenant's daily cap
    waits for that settlement: once the swarm is answered, the tenant's daily spend equals
    its ledger. The settlement rides the group commit of the answer's ledger row
    (`SwarmWrite.settles`): a slow commit carrying it is the window a cancel meets."""
    real = StateWriter._apply
    settling = asyncio.Event()

    async def slow_settles(writer: StateWriter, writes: list[SwarmWrite]) -> Any:
        if any(w.settles for w in writes):
            settling.set()
            await asyncio.sleep(0.5)
        return await real(writer, writes)

    monkeypatch.setattr(StateWriter, "_apply", slow_settles)
    # b is still in flight when a's answer is written: a's write is not the swarm's end
    body = {"task": "t", "synthesis": {"strategy": "none"},
            "agents": [agent("a"), agent("b", "[[sim latency_ms=5000]]")]}
    swarm_id = (await harness.post(body)).json()["id"]
    await wait_for(settling.wait(), 10)  # a's answer is in, its cost being settled
    assert (await harness.client.post(f"/swarms/{swarm_id}/cancel")).status_code == 202
    data = await harness.wait(swarm_id)
    ledger = {r.subtask_name: r for r in await rows(harness, swarm_id)}
    async with harness.app.state.sessions() as s:
        day = (await s.execute(select(TenantDailySpend.spent_usd).where(
            TenantDailySpend.tenant == "default"))).scalar_one()
    assert data["status"] == "cancelled" and ledger["a"].outcome == "ok"
    assert ledger["a"].cost_usd > 0
    assert day == sum(r.cost_usd for r in ledger.values()) == Decimal(data["usage"]["cost_usd"])


async def test_a_plan_nested_10000_deep_is_an_invalid_plan_not_a_crash(harness: Harness
                                                                        ) -> None:
    deep = "[" * 10_000 + "]" * 10_000
    data = await harness.run({"task": f'plan this [[sim answer="{deep}"]]'})
    assert data["status"] == "failed", data
    assert data["error"]["code"] == "plan_invalid"
    assert data["error"]["details"]["reason"] == "not_json"
    planner = data["subtasks"][0]
    assert planner["attempts"] == 2  # the answer and one repair, each answered once
    async with harness.app.state.sessions() as s:
        rescues = (await s.execute(select(Swarm.rescues))).scalar_one()
    assert rescues == 0


async def test_a_body_nested_10000_deep_is_a_bad_answer_and_retried() -> None:
    answers = [b'{"choices": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
               b'{"choices": [{"message": {"content": "fine"}, "finish_reason": "stop"}]}']

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=answers.pop(0))

    client = GatewayClient("http://gw/v1", transport=httpx.MockTransport(handler))
    try:
        result = await client.complete(ChatRequest("kimi-k2.5", [], 10), max_attempts=2,
                                       before_attempt=None)
    finally:
        await client.aclose()
    assert result.content == "fine"
    assert [a.outcome for a in result.attempts] == ["invalid_response", "ok"]


async def test_the_next_call_is_written_ahead_while_it_waits_for_its_slot(harness: Harness
                                                                          ) -> None:
    """The first attempt's row is committed before the subtask waits for its slots (so the
    commit overlaps the call in flight); the subtask stays pending until it has them, and a
    cancel while it waits settles the row as never sent."""
    body = {"task": "t", "agents": [agent("a", SLOW), agent("b")],
            "synthesis": {"strategy": "none"}, "limits": {"concurrency": 1}}
    swarm_id = (await harness.post(body)).json()["id"]

    async def b_ahead() -> bool:
        return any(r.subtask_name == "b" and r.outcome == "in_flight"
                   for r in await rows(harness, swarm_id))

    await until(b_ahead, 10, "b's attempt written ahead", every=0.02)
    status = {s["name"]: s["status"]
              for s in (await harness.client.get(f"/swarms/{swarm_id}")).json()["subtasks"]}
    assert status == {"a": "running", "b": "pending"}  # one slot: a's
    assert harness.sim_stats.in_flight == 1
    assert (await harness.client.post(f"/swarms/{swarm_id}/cancel")).status_code == 202
    data = await harness.wait(swarm_id)
    assert data["status"] == "cancelled"
    b_rows = [(r.attempt, r.outcome, r.cost_usd) for r in await rows(harness, swarm_id)
              if r.subtask_name == "b"]
    assert b_rows == [(1, "cancelled", Decimal(0))]  # never sent: no cost
    assert "b" not in {k.split(":")[1] for k in (await harness.stats())["by_key"]}
