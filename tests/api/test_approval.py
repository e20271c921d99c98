"""The approval gate (SPEC §14) on both databases: a held swarm calls nothing and survives a
restart; approve (as shown, or with an edited plan), reject, the timeout, the thresholds."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app import metrics
from app.db import queries
from app.db.tables import GatewayCall
from tests.conftest import Harness, make_settings, start_harness

AGENTS = [{"name": "alpha", "prompt": "say alpha"}, {"name": "beta", "prompt": "say beta"}]


def body(approval: Any = "always", **more: Any) -> dict[str, Any]:
    limits = {"approval": approval, **more.pop("limits", {})}
    return {"task": "review the plan", "agents": AGENTS, "limits": limits, **more}


async def held(h: Harness, payload: dict[str, Any]) -> dict[str, Any]:
    r = await h.post(payload)
    assert r.status_code == 202, r.text
    return await awaiting(h, r.json()["id"])


async def awaiting(h: Harness, swarm_id: str, timeout: float = 20) -> dict[str, Any]:
    """The swarm once it is held for approval."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        data: dict[str, Any] = (await h.client.get(f"/swarms/{swarm_id}")).json()
        if data["status"] == "awaiting_approval":
            return data
        assert data["status"] in ("queued", "planning"), data
        assert asyncio.get_running_loop().time() < deadline, data
        await asyncio.sleep(0.05)


def called(h: Harness, swarm_id: str) -> list[str]:
    """The subtasks of a swarm the gateway was asked for (their idempotency keys' names)."""
    return sorted({k.split(":")[1] for k in h.sim_stats.by_key if k.startswith(swarm_id)})


async def test_named_agents_answer_awaiting_and_call_nothing(harness: Harness) -> None:
    r = await harness.post(body())
    assert r.status_code == 202, r.text
    data = r.json()
    assert data["status"] == "awaiting_approval"
    assert data["queue_position"] is None
    assert [a["name"] for a in data["plan"]["agents"]] == ["alpha", "beta"]
    estimate = data["estimate"]
    assert estimate["agents"] == 2 and estimate["width"] == 2 and estimate["depth"] == 1
    assert 0 < float(estimate["cost_usd"]["expected"]) <= float(estimate["cost_usd"]["max"])
    assert {s["status"] for s in data["subtasks"]} == {"pending"}
    await asyncio.sleep(1.0)  # several claim polls (0.2 s)
    again = (await harness.client.get(f"/swarms/{data['id']}")).json()
    assert again["status"] == "awaiting_approval"
    assert harness.sim_stats.calls == 0
    assert again["usage"]["gateway_calls"] == 0 and again["usage"]["cost_usd"] == "0"


async def test_a_held_swarm_holds_no_lease_through_many_claims(database_url: str) -> None:
    h, close = await start_harness(make_settings(database_url, poll_interval_s=0.05))
    try:
        data = await held(h, {"task": "plan", "limits": {"approval": "always"}})
        await asyncio.sleep(2.0)  # some forty claim polls
        async with h.app.state.sessions() as session, session.begin():
            row = await queries.get_swarm(session, data["id"], None)
        assert row is not None and row.status == "awaiting_approval"
        assert (row.lease_owner, row.lease_expires_at, row.reserved_usd) == (None, None, 0)
        assert called(h, data["id"]) == ["@planner"]
        assert (await h.client.get(f"/swarms/{data['id']}")).json()["status"] == (
            "awaiting_approval")
    finally:
        await close()


def outcomes() -> dict[str, float]:
    return {o: metrics.approvals.labels(o)._value.get() for o in metrics.APPROVAL_OUTCOMES}


async def test_the_metric_counts_each_outcome(database_url: str) -> None:
    h, close = await start_harness(make_settings(database_url, poll_interval_s=0.1))
    try:
        before = outcomes()
        await h.run(body({"above_agents": 5}))
        approved = await held(h, body())
        await h.client.post(f"/swarms/{approved['id']}/approve")
        await h.wait(approved["id"])
        rejected = await held(h, body())
        await h.client.post(f"/swarms/{rejected['id']}/reject")
        timed = await held(h, body(limits={"approval_timeout_s": 0.2}))
        await h.wait(timed["id"])
        after = outcomes()
        assert {o: after[o] - before[o] for o in after} == {
            "auto": 1, "approved": 1, "rejected": 1, "timed_out": 1}
        text = (await h.client.get("/metrics")).text
        assert 'swarm_approvals_total{outcome="approved"}' in text
    finally:
        await close()


async def test_the_max_is_the_reservation_the_run_makes(harness: Harness) -> None:
    data = await held(harness, body(synthesis={"strategy": "concatenate"}))
    await harness.client.post(f"/swarms/{data['id']}/approve")
    assert (await harness.wait(data["id"]))["status"] == "succeeded"
    async with harness.app.state.sessions() as session, session.begin():
        reserved = (await session.execute(
            select(func.sum(GatewayCall.reserved_usd)).where(
                GatewayCall.swarm_id == data["id"]))).scalar_one()
    assert reserved == Decimal(data["estimate"]["cost_usd"]["max"])
    assert data["estimate"]["calls"] == {"expected": 2, "max": 2}


async def test_approve_runs_the_plan_shown(harness: Harness) -> None:
    data = await held(harness, body())
    r = await harness.client.post(f"/swarms/{data['id']}/approve")
    assert r.status_code == 202, r.text
    assert r.json()["status"] in ("queued", "running", "synthesizing", "succeeded")
    done = await harness.wait(data["id"])
    assert done["status"] == "succeeded", done
    assert called(harness, data["id"]) == ["@synthesizer", "alpha", "beta"]


async def test_approve_with_an_edited_plan_runs_exactly_that_plan(harness: Harness) -> None:
    data = await held(harness, body())
    edited = {"agents": [{"name": "gamma", "prompt": "say gamma"},
                         {"name": "delta", "prompt": "say delta", "depends_on": ["gamma"]}]}
    r = await harness.client.post(f"/swarms/{data['id']}/approve", json=edited)
    assert r.status_code == 202, r.text
    assert [a["name"] for a in r.json()["plan"]["agents"]] == ["gamma", "delta"]
    done = await harness.wait(data["id"])
    assert done["status"] == "succeeded", done
    assert [s["name"] for s in done["subtasks"]] == ["gamma", "delta", "@synthesizer"]
    assert called(harness, data["id"]) == ["@synthesizer", "delta", "gamma"]
    trail = (await harness.client.get("/audit", params={"action": "approve"})).json()
    assert [r["swarm_id"] for r in trail["items"]] == [data["id"]]
    assert done["spec"]["agents"][0]["name"] == "gamma"


async def test_a_planned_swarm_stops_after_planning(harness: Harness) -> None:
    r = await harness.post({"task": "plan this", "limits": {"approval": "always"}})
    assert r.status_code == 202, r.text
    data = await awaiting(harness, r.json()["id"])
    workers = [s for s in data["subtasks"] if s["kind"] == "worker"]
    assert workers and {s["status"] for s in workers} == {"pending"}
    assert [a["name"] for a in data["plan"]["agents"]] == [s["name"] for s in workers]
    assert called(harness, data["id"]) == ["@planner"]
    # the plan is postable as it is
    posted = await harness.post({"task": "plan this", "agents": data["plan"]["agents"]})
    assert posted.status_code == 202, posted.text
    r = await harness.client.post(f"/swarms/{data['id']}/approve")
    assert r.status_code == 202, r.text
    done = await harness.wait(data["id"])
    assert done["status"] == "succeeded", done
    assert set(called(harness, data["id"])) == {"@planner", "@synthesizer",
                                                *(s["name"] for s in workers)}


async def test_reject_cancels_with_the_reason(harness: Harness) -> None:
    data = await held(harness, body())
    r = await harness.client.post(f"/swarms/{data['id']}/reject", json={"reason": "too dear"})
    assert r.status_code == 202, r.text
    done = r.json()
    assert done["status"] == "cancelled"
    assert done["error"]["code"] == "rejected" and "too dear" in done["error"]["message"]
    assert {s["status"] for s in done["subtasks"]} == {"cancelled"}
    assert harness.sim_stats.calls == 0
    trail = (await harness.client.get("/audit", params={"action": "reject"})).json()
    assert [r["swarm_id"] for r in trail["items"]] == [data["id"]]


async def test_decisions_on_a_swarm_not_awaiting_are_409(harness: Harness) -> None:
    plain = await harness.run({"task": "t", "agents": AGENTS})
    for action in ("approve", "reject"):
        r = await harness.client.post(f"/swarms/{plain['id']}/{action}")
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "not_awaiting_approval"
    data = await held(harness, body())
    assert (await harness.client.post(f"/swarms/{data['id']}/reject")).status_code == 202
    r = await harness.client.post(f"/swarms/{data['id']}/approve")
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_awaiting_approval"


@pytest.mark.parametrize("edited, field", [
    ({"agents": [{"name": "a", "depends_on": ["nobody"]}]}, "agents.0.depends_on"),
    ({"agents": [{"name": "a", "model": "gpt-99-ultra"}]}, "agents.0.model"),
    ({"agents": [{"name": "a"}, {"name": "a"}]}, "agents.1.name"),
    ({"agents": [{"name": "a", "colour": "red"}]}, "colour"),
    ({"limits": {"budget_usd": -1}}, "budget_usd"),
])
async def test_a_bad_edited_plan_is_422_and_keeps_the_swarm_held(
        harness: Harness, edited: dict[str, Any], field: str) -> None:
    data = await held(harness, body())
    r = await harness.client.post(f"/swarms/{data['id']}/approve", json=edited)
    assert r.status_code == 422, r.text
    assert field in r.text
    again = (await harness.client.get(f"/swarms/{data['id']}")).json()
    assert again["status"] == "awaiting_approval"
    assert [a["name"] for a in again["plan"]["agents"]] == ["alpha", "beta"]


async def test_the_timeout_fails_it(database_url: str) -> None:
    h, close = await start_harness(make_settings(database_url, poll_interval_s=0.1))
    try:
        data = await held(h, body(limits={"approval_timeout_s": 0.3}))
        done = await h.wait(data["id"], timeout=20)
        assert done["status"] == "failed"
        assert done["error"]["code"] == "approval_timeout"
        assert h.sim_stats.calls == 0
    finally:
        await close()


async def test_thresholds_both_ways(harness: Harness) -> None:
    cheap = await harness.post(body({"above_usd": "1000"}))
    assert cheap.json()["status"] != "awaiting_approval"
    dear = await harness.post(body({"above_usd": "0"}))
    assert dear.json()["status"] == "awaiting_approval"
    few = await harness.post(body({"above_agents": 2}))
    assert few.json()["status"] != "awaiting_approval"
    many = await harness.post(body({"above_agents": 1}))
    assert many.json()["status"] == "awaiting_approval"
    assert (await harness.wait(cheap.json()["id"]))["status"] == "succeeded"
    assert (await harness.wait(few.json()["id"]))["status"] == "succeeded"
    planned = await harness.post({"task": "plan", "limits": {"approval": {"above_agents": 1000}}})
    assert (await harness.wait(planned.json()["id"]))["status"] == "succeeded"


async def test_a_held_swarm_survives_a_restart(database_url: str) -> None:
    settings = make_settings(database_url)
    h, close = await start_harness(settings)
    try:
        data = await held(h, {"task": "plan", "limits": {"approval": "always"}})
    finally:
        await close()
    h2, close2 = await start_harness(settings)
    try:
        await asyncio.sleep(0.6)  # claim polls of the new process
        again = (await h2.client.get(f"/swarms/{data['id']}")).json()
        assert again["status"] == "awaiting_approval"
        assert again["plan"] == data["plan"]
        assert h2.sim_stats.calls == 0
        assert (await h2.client.post(f"/swarms/{data['id']}/approve")).status_code == 202
        done = await h2.wait(data["id"])
        assert done["status"] == "succeeded", done
        assert "@planner" not in called(h2, data["id"])  # planned once, before the restart
    finally:
        await close2()


async def test_held_swarms_count_toward_max_active_swarms(database_url: str,
                                                          tmp_path: Any) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text("[defaults]\nmax_active_swarms = 1\n")
    h, close = await start_harness(make_settings(database_url, tenants_file=str(tenants)))
    try:
        await held(h, body())
        r = await h.post({"task": "t", "agents": AGENTS})
        assert r.status_code == 429, r.text
        assert r.json()["error"]["details"]["limit"] == "max_active_swarms"
    finally:
        await close()


async def test_event_and_webhook(database_url: str) -> None:
    seen: list[dict[str, Any]] = []

    def receive(request: httpx.Request) -> httpx.Response:
        seen.append(httpx.Response(200, content=request.content).json())
        return httpx.Response(204)

    settings = make_settings(database_url, webhook_allow_private=True,
                             webhook_allow_http=True, webhook_secret="s3cret")
    h, close = await start_harness(settings, webhook_transport=httpx.MockTransport(receive))
    try:
        data = await held(h, body(webhook_url="http://hooks.example/x"))
        deadline = asyncio.get_running_loop().time() + 20
        while not seen:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        assert seen[0]["status"] == "awaiting_approval" and seen[0]["estimate"]
        await h.client.post(f"/swarms/{data['id']}/reject")
        while len(seen) < 2:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        assert seen[1]["status"] == "cancelled"
        # the stream of an ended swarm: every event, then its end
        text = (await h.client.get(f"/swarms/{data['id']}/events")).text
        names = [line.split(": ", 1)[1] for line in text.splitlines()
                 if line.startswith("event:")]
        assert names == ["swarm.awaiting_approval", "swarm.completed"]
        first = json.loads(next(line for line in text.splitlines()
                                if line.startswith("data:"))[5:])
        assert first["cost_usd"] == data["estimate"]["cost_usd"]
    finally:
        await close()


def shape(i: int, rule: Any = "never") -> dict[str, Any]:
    return {"task": f"Assess vendor number {i}", "model": "kimi-k2.5", "max_tokens": 600,
            "synthesis": {"strategy": "concatenate"}, "limits": {"approval": rule},
            "agents": [{"name": f"a{j}", "system_prompt": f"You are analyst {j}."}
                       for j in range(4)]}


def figures(estimate: dict[str, Any]) -> dict[str, Any]:
    """An estimate route's answer as a held swarm carries it (no plan, its agent count)."""
    return {"agents": len(estimate["plan"]["agents"]),
            **{k: v for k, v in estimate.items() if k != "plan"}}


async def test_thresholds_read_the_estimate_from_history(harness: Harness) -> None:
    """`above_usd` compares the expected cost of `POST /swarms/estimate` (the tenant's
    history), not the price table's worst case: a rule between the two runs the swarm."""
    cold = (await harness.client.post("/swarms/estimate", json=shape(3))).json()
    for i in range(3):
        assert (await harness.run(shape(i)))["status"] == "succeeded"
    warm = (await harness.client.post("/swarms/estimate", json=shape(3))).json()
    assert warm["basis"]["samples"] == 3 * 4
    expected, fallback = (Decimal(e["cost_usd"]["expected"]) for e in (warm, cold))
    assert expected * 2 < fallback  # the simulator answers well under max_tokens
    # above the expected cost by a millionth of a cent: held, showing the route's figures
    dear = await harness.post(shape(3, {"above_usd": str(expected - Decimal("1e-8"))}))
    assert dear.json()["status"] == "awaiting_approval", dear.text
    assert dear.json()["estimate"] == figures(warm)
    # at it (not above), and between it and the price table's figure: it runs
    for limit in (expected, (expected + fallback) / 2):
        cheap = await harness.post(shape(3, {"above_usd": str(limit)}))
        assert cheap.json()["status"] != "awaiting_approval", cheap.text
        assert (await harness.wait(cheap.json()["id"]))["status"] == "succeeded"


async def test_a_planned_swarm_is_held_on_the_history_estimate(harness: Harness) -> None:
    for i in range(3):
        assert (await harness.run(shape(i)))["status"] == "succeeded"
    planned = {"task": "Compare three queues", "model": "kimi-k2.5", "max_tokens": 600,
               "orchestrator": {"max_subtasks": 3, "routing": "pinned"},
               "synthesis": {"strategy": "concatenate"}}
    shown = (await harness.client.post("/swarms/estimate", json=planned)).json()
    expected = Decimal(shown["cost_usd"]["expected"])
    assert expected * 2 < Decimal(shown["cost_usd"]["max"])  # history, not max_tokens
    rule = {"above_usd": str(expected - Decimal("1e-8"))}
    r = await harness.post({**planned, "limits": {"approval": rule}})
    data = await awaiting(harness, r.json()["id"])
    assert [a["name"] for a in data["plan"]["agents"]] == [
        a["name"] for a in shown["plan"]["agents"]]
    assert data["estimate"]["cost_usd"] == shown["cost_usd"]
    r = await harness.post({**planned, "limits": {"approval": {"above_usd": str(expected)}}})
    done = await harness.wait(r.json()["id"])
    assert done["status"] == "succeeded", done


async def test_an_edited_plan_carries_the_history_estimate(harness: Harness) -> None:
    for i in range(3):
        assert (await harness.run(shape(i)))["status"] == "succeeded"
    data = await held(harness, shape(3, "always"))
    edited = shape(4)["agents"][:2]
    warm = (await harness.client.post("/swarms/estimate", json={**shape(3),
                                                                  "agents": edited})).json()
    r = await harness.client.post(f"/swarms/{data['id']}/approve", json={"agents": edited})
    assert r.status_code == 202, r.text
    async with harness.app.state.sessions() as session, session.begin():
        row = await queries.get_swarm(session, data["id"], None)
    assert row is not None and row.approval is not None
    assert row.approval["estimate"] == figures(warm)
    assert (await harness.wait(data["id"]))["status"] == "succeeded"
