"""POST /swarms/estimate (SPEC §14) on both databases: named agents make no gateway call,
`max` is the reservation the run makes, history brings `expected` within 25 % of the next
run, the planner's plan comes back postable with its cost, and bad input is a 4xx."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.db.tables import GatewayCall
from app.estimate_schemas import SwarmEstimate
from swarm_api_client import AsyncSwarmClient
from tests.conftest import Harness, make_settings, start_harness


def fan_out(task: str, n: int = 6, strategy: str = "concatenate") -> dict[str, Any]:
    return {"task": task, "model": "kimi-k2.5", "max_tokens": 600,
            "synthesis": {"strategy": strategy},
            "agents": [{"name": f"a{i}", "system_prompt": f"You are analyst {i}."}
                       for i in range(n)]}


async def ledger(h: Harness, swarm_id: str | None) -> tuple[Decimal, Decimal, int]:
    """Reserved and billed USD and rows of a swarm's ledger (None: calls of no swarm)."""
    async with h.app.state.sessions() as s:
        where = (GatewayCall.swarm_id.is_(None) if swarm_id is None
                 else GatewayCall.swarm_id == swarm_id)
        reserved, cost, n = (await s.execute(
            select(func.sum(GatewayCall.reserved_usd), func.sum(GatewayCall.cost_usd),
                   func.count()).where(where))).one()
    return Decimal(reserved or 0), Decimal(cost or 0), int(n)


async def estimate(h: Harness, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = await h.client.post("/swarms/estimate", json=body)
    assert r.status_code == status, r.text
    data: dict[str, Any] = r.json()
    return data


async def test_named_agents_make_no_gateway_call_and_create_nothing(harness: Harness) -> None:
    body = fan_out("Review the payment service", strategy="synthesize")
    body["agents"][3]["depends_on"] = ["a0", "a1"]
    got = await estimate(harness, body)
    assert harness.sim_stats.calls == 0
    assert (await harness.client.get("/swarms")).json()["items"] == []
    assert await ledger(harness, None) == (0, 0, 0)
    assert [a["name"] for a in got["plan"]["agents"]] == [f"a{i}" for i in range(6)]
    assert got["plan"]["agents"][3]["depends_on"] == ["a0", "a1"]
    assert got["plan"]["agents"][0]["model"] == "kimi-k2.5"
    assert (got["width"], got["depth"]) == (5, 2)
    assert got["calls"] == {"expected": 7.0, "max": 7}  # six agents and the synthesizer
    assert got["basis"] == {"samples": 0, "since": None}
    cost = got["cost_usd"]
    # no history: every answer at max_tokens, so expected is p90 and both stay under max
    assert cost["expected"] == cost["p90"]
    assert 0 < Decimal(cost["expected"]) < Decimal(cost["max"])
    assert got["fits"] == {"budget": True, "tenant_daily": True, "daily": True}
    assert "planning_cost_usd" not in got


async def test_max_is_the_reservation_the_run_makes(harness: Harness) -> None:
    body = fan_out("Audit the ledger code", n=5)
    got = await estimate(harness, body)
    run = await harness.run(body)
    assert run["status"] == "succeeded"
    reserved, cost, rows = await ledger(harness, run["id"])
    assert rows == 5
    assert Decimal(got["cost_usd"]["max"]) == reserved
    assert got["tokens"]["max"] >= run["usage"]["prompt_tokens"] + run["usage"][
        "completion_tokens"]
    # concurrency 8 holds all five at once
    assert Decimal(got["reservation_usd"]) == reserved
    assert Decimal(got["cost_usd"]["expected"]) >= cost  # no history: answers at max_tokens


async def test_max_bounds_a_run_whose_prompts_carry_outputs(harness: Harness) -> None:
    body = fan_out("Audit the ledger code", n=4, strategy="synthesize")
    body["agents"][2]["depends_on"] = ["a0"]
    got = await estimate(harness, body)
    run = await harness.run(body)
    reserved, _, rows = await ledger(harness, run["id"])
    assert rows == 5
    assert Decimal(got["cost_usd"]["max"]) >= reserved


async def test_history_brings_expected_near_the_next_run(harness: Harness) -> None:
    for i in range(4):
        assert (await harness.run(fan_out(f"Assess vendor number {i}", n=12,
                                          strategy="synthesize")))["status"] == "succeeded"
    body = fan_out("Assess vendor number 4", n=12, strategy="synthesize")
    got = await estimate(harness, body)
    assert got["basis"]["samples"] == 4 * 13 and got["basis"]["since"] is not None
    run = await harness.run(body)
    actual = Decimal(run["usage"]["cost_usd"])
    expected = Decimal(got["cost_usd"]["expected"])
    # measured: expected is 4.8 % under the actual cost here, on both databases (the
    # simulator's answers are 20-400 tokens, fixed by the prompt); the contract's band is 25 %
    assert abs(expected - actual) <= actual * Decimal("0.25"), (expected, actual)
    assert expected <= Decimal(got["cost_usd"]["p90"]) <= Decimal(got["cost_usd"]["max"])
    assert actual <= Decimal(got["cost_usd"]["max"])


async def test_planner_estimate_returns_a_postable_plan_and_its_cost(harness: Harness) -> None:
    body = {"task": "Compare three databases for our queue", "model": "kimi-k2.5",
            "orchestrator": {"max_subtasks": 4}}
    got = await estimate(harness, body)
    assert harness.sim_stats.calls == 1  # the planner's call alone
    assert (await harness.client.get("/swarms")).json()["items"] == []
    _, billed, rows = await ledger(harness, None)
    assert rows == 1 and billed > 0
    assert Decimal(got["planning_cost_usd"]) == billed
    agents = got["plan"]["agents"]
    assert 1 <= len(agents) <= 4 and got["calls"]["max"] == len(agents) + 1
    run = await harness.run({**body, "agents": agents})
    assert run["status"] == "succeeded"
    assert [s["name"] for s in run["subtasks"] if s["kind"] == "worker"] == [
        a["name"] for a in agents]


@pytest.mark.parametrize(("change", "code"), [
    ({"model": "no-such-model"}, "unknown_model"),
    ({"agents": [{"name": "a", "depends_on": ["b"]}, {"name": "b", "depends_on": ["a"]}]},
     "dependency_cycle"),
    ({"agents": [{"name": "a"}, {"name": "a"}]}, "duplicate_agent_name"),
    ({"surprise": 1}, "validation_error"),
    ({"task": "  "}, "validation_error"),
    ({"limits": {"budget_usd": 0}}, "validation_error"),
])
async def test_refused_like_a_creation(harness: Harness, change: dict[str, Any],
                                       code: str) -> None:
    got = await estimate(harness, {**fan_out("t", n=2), **change}, 422)
    assert got["error"]["code"] == code
    assert harness.sim_stats.calls == 0


async def test_not_json_is_a_4xx(harness: Harness) -> None:
    r = await harness.client.post("/swarms/estimate", content=b"{not json",
                                  headers={"content-type": "application/json"})
    assert r.status_code in (400, 422)
    assert "error" in r.json()


@pytest.fixture
async def keyed(database_url: str) -> AsyncIterator[Harness]:
    h, close = await start_harness(make_settings(
        database_url, api_keys="a:ka,b:kb", daily_budget_usd="0.000001"))
    yield h
    await close()


async def test_tenant_scoped_and_keyed(keyed: Harness) -> None:
    body = fan_out("Assess vendor", n=3)
    assert (await keyed.client.post("/swarms/estimate", json=body)).status_code == 401
    assert (await keyed.client.post("/swarms/estimate", json=body, headers={
        "Authorization": "Bearer nope"})).status_code == 401
    a = {"Authorization": "Bearer ka"}
    got = (await keyed.client.post("/swarms/estimate", json=body, headers=a)).json()
    # the service's daily cap (a millionth of a dollar) cannot hold the worst case
    assert got["fits"]["daily"] is False and got["fits"]["budget"] is True
    assert got["basis"]["samples"] == 0


async def test_the_client_reads_the_answer_into_its_model(harness: Harness) -> None:
    transport = httpx.ASGITransport(app=harness.app)
    async with AsyncSwarmClient("http://api", transport=transport) as client:
        got = await client.estimate(fan_out("Client estimate", n=3))
    assert isinstance(got, SwarmEstimate)
    assert [a.name for a in got.plan.agents] == ["a0", "a1", "a2"]
    assert got.calls.max == 3 and Decimal(got.cost_usd.max) > 0


async def test_a_vote_counts_its_synthesizer_in_max_only(harness: Harness) -> None:
    voted = await estimate(harness, fan_out("Pick one", n=3, strategy="vote"))
    merged = await estimate(harness, fan_out("Pick one", n=3, strategy="concatenate"))
    assert voted["calls"] == {"expected": 3.0, "max": 4}
    assert voted["cost_usd"]["expected"] == merged["cost_usd"]["expected"]
    assert Decimal(voted["cost_usd"]["max"]) > Decimal(merged["cost_usd"]["max"])


async def test_a_plan_still_invalid_after_its_repair_is_a_422_with_its_cost(
        harness: Harness) -> None:
    body = {"task": "Plan badly [[sim plan=cyclic plan_times=2]]", "model": "kimi-k2.5"}
    got = await estimate(harness, body, 422)
    assert got["error"]["code"] == "plan_invalid"
    assert harness.sim_stats.calls == 2  # the plan and its one repair, both billed
    _, billed, rows = await ledger(harness, None)
    assert rows == 2 and Decimal(got["error"]["details"]["planning_cost_usd"]) == billed > 0
    assert (await harness.client.get("/swarms")).json()["items"] == []


async def test_a_budget_that_cannot_hold_the_planning_call_is_a_422(harness: Harness) -> None:
    body = {"task": "Plan", "model": "kimi-k2.5", "limits": {"budget_usd": "0.000001"}}
    got = await estimate(harness, body, 422)
    assert got["error"]["code"] == "budget_exceeded"
    assert got["error"]["details"]["field"] == "limits.budget_usd"
    assert harness.sim_stats.calls == 0


async def test_a_gateway_that_fails_planning_is_a_503(harness: Harness) -> None:
    body = {"task": "Plan [[sim fail=500 retry_after=0]]", "model": "kimi-k2.5",
            "limits": {"max_attempts": 2}}
    got = await estimate(harness, body, 503)
    assert got["error"]["code"] == "gateway_unavailable"
    assert harness.sim_stats.calls == 2


async def test_max_holds_an_output_schema_and_model_lists(harness: Harness) -> None:
    schema = {"type": "object", "properties": {"verdict": {"type": "string"}},
              "required": ["verdict"], "additionalProperties": False}
    body = fan_out("Judge the change", n=3)
    body["model"] = ["kimi-k2.5", "deepseek-v3.2"]
    body["agents"][0]["output_schema"] = schema
    body["agents"][0]["system_prompt"] += ' [[sim answer="{\\"verdict\\": \\"ok\\"}"]]'
    got = await estimate(harness, body)
    assert got["plan"]["agents"][1]["model"] == ["kimi-k2.5", "deepseek-v3.2"]
    run = await harness.run(body)
    assert run["status"] == "succeeded", run["error"]
    reserved, _, rows = await ledger(harness, run["id"])
    assert rows == 3 and Decimal(got["cost_usd"]["max"]) == reserved
