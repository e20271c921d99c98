"""Spend invariants under mixed outcomes (SPEC §4): whatever a gateway answers — failures
with usage (billed), answers without usage (billed at a bound, unresolved), unusable bodies,
calls cut off by a cancel or the deadline (unknown at their reservation), a budget stop —
every total the service shows is the ledger's: the swarm's usage, its subtasks', `/usage`,
the daily cap's day and the spend metrics, and `unresolved_usd` is its `at_bound` rows
(both backends)."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from app.db.session import SessionFactory, make_db_engine, make_session_factory
from app.db.tables import DailySpend, GatewayCall
from app.gateway.client import GatewayClient
from app.states import NOT_BILLED
from tests.conftest import app_on, make_settings
from tests.helpers import agent


async def daily_spent(sessions: SessionFactory) -> Decimal:
    async with sessions() as s:
        return (await s.execute(select(DailySpend.spent_usd))).scalar_one_or_none() or Decimal(0)


KIMI = "kimi-k2.5"


def _spend_metric(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"model": KIMI}) or 0.0


class Scripted:
    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.in_flight = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        text = json.dumps(body["messages"])
        key = request.headers.get("idempotency-key", "")
        n = self.seen[key] = self.seen.get(key, 0) + 1
        usage = {"prompt_tokens": 30, "completion_tokens": 7}
        ok: dict[str, Any] = {"choices": [{"message": {"role": "assistant", "content": "x"},
                                           "finish_reason": "stop"}], "usage": usage}
        if "SLOW" in text:
            self.in_flight += 1
            try:
                await asyncio.sleep(30)
            finally:
                self.in_flight -= 1
        if "X500U" in text and n == 1:
            return httpx.Response(500, json={"error": {"message": "boom"}, "usage": usage},
                                  headers={"retry-after-ms": "0"})
        if "X429" in text and n == 1:
            return httpx.Response(429, json={"error": {"message": "slow"}},
                                  headers={"retry-after-ms": "0"})
        if "BAD" in text and n == 1:
            return httpx.Response(200, json={"nope": 1, "usage": usage})
        if "SILENT" in text or "X429" in text:
            ok.pop("usage")
        return httpx.Response(200, json=ok)


async def _check(c: httpx.AsyncClient, database_url: str, ids: list[str],
                 m0: tuple[float, float]) -> None:
    engine = make_db_engine(database_url)
    try:
        s_f = make_session_factory(engine)
        async with s_f() as s:
            all_rows = list((await s.execute(select(GatewayCall))).scalars())
        day = await daily_spent(s_f)
    finally:
        await engine.dispose()
    assert not [r for r in all_rows if r.outcome == "in_flight"]
    billed = [r for r in all_rows if r.outcome not in NOT_BILLED]
    for sid in ids:
        data = (await c.get(f"/swarms/{sid}")).json()
        mine = [r for r in billed if r.swarm_id == sid]
        cost = sum((r.cost_usd for r in mine), Decimal(0))
        lost = sum((r.cost_usd for r in mine if r.at_bound), Decimal(0))
        assert Decimal(data["usage"]["cost_usd"]) == cost, (data["status"], data["usage"], mine)
        assert Decimal(data["usage"]["unresolved_usd"]) == lost
        assert data["usage"]["gateway_calls"] == len(mine)
        assert sum(Decimal(x["usage"]["cost_usd"]) for x in data["subtasks"]) == cost
    total = sum((r.cost_usd for r in billed), Decimal(0))
    lost = sum((r.cost_usd for r in billed if r.at_bound), Decimal(0))
    report = (await c.get("/usage")).json()["total"]
    assert Decimal(report["cost_usd"]) == total and Decimal(report["unresolved_usd"]) == lost
    assert day == total
    assert _spend_metric("swarm_spend_usd_total") - m0[0] == pytest.approx(float(total),
                                                                           abs=1e-9)
    assert _spend_metric("swarm_spend_unresolved_usd_total") - m0[1] == pytest.approx(
        float(lost), abs=1e-9)


@pytest.mark.parametrize("how", ["cancel", "deadline", "budget"])
async def test_every_total_is_the_ledgers_whatever_the_outcomes(database_url: str,
                                                                how: str) -> None:
    """Two swarms whose calls fail with usage, are rate-limited then answer without usage,
    answer an unusable body, answer silently, hang (cut off by a cancel or the deadline) or
    run out of budget: per swarm, the ledger == its usage == its subtasks', unresolved == its
    at_bound rows; /usage, the daily cap's day and both spend metrics == the ledger."""
    gw = Scripted()
    gateway = GatewayClient("http://gw/v1", transport=httpx.MockTransport(gw))
    m0 = (_spend_metric("swarm_spend_usd_total"), _spend_metric("swarm_spend_unresolved_usd_total"))
    settings = make_settings(database_url, daily_budget_usd=Decimal("5"))
    names = ["X500U", "X429", "BAD", "SILENT", "SLOW", "PLAIN"]
    limits: dict[str, Any] = {"concurrency": 8, "max_attempts": 3}
    if how == "deadline":
        limits["deadline_s"] = 1.5
    if how == "budget":
        limits["budget_usd"] = "0.011"
        names.remove("SLOW")
    async with app_on(settings, gateway) as c:
        ids = []
        for i in range(2):
            r = await c.post("/swarms", json={
                "task": "t", "model": KIMI, "max_tokens": 800,
                "synthesis": {"strategy": "synthesize"}, "limits": limits,
                "agents": [agent(f"{n.lower()}{i}", n) for n in names]})
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
        if how == "cancel":
            for _ in range(200):
                if gw.in_flight >= 2:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)
            for sid in ids:
                assert (await c.post(f"/swarms/{sid}/cancel")).status_code == 202
        for sid in ids:
            data = (await c.get(f"/swarms/{sid}", params={"wait": 20})).json()
            assert data["status"] in ("failed", "cancelled", "succeeded"), data["status"]
        await asyncio.sleep(0.3)
        await _check(c, database_url, ids, m0)
