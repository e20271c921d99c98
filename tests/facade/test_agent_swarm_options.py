"""`agent_swarm`'s run controls (SPEC §10): concurrency, budget and deadline reach the swarm's
limits, and the caller's model runs every worker unless it asks the planner to route."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from app.simulator.responses import PLAN_HINTS
from tests.facade.conftest import Facade

TASK = [{"role": "user", "content": "Review the payment service"}]


async def _swarm_of(facade: Facade, options: dict[str, Any]) -> dict[str, Any]:
    r = await facade.http.post("/v1/chat/completions", json={
        "model": "kimi-k2.5", "messages": TASK,
        "agent_swarm": {"enabled": True, "max_sub_agents": 4, **options}})
    assert r.status_code == 200, r.text
    return await facade.swarm(r.json()["swarm_id"])


async def test_run_controls_become_the_swarms_limits(facade_sqlite: Facade) -> None:
    swarm = await _swarm_of(facade_sqlite, {"concurrency": 64, "budget_usd": "2.5",
                                            "deadline_s": 120})
    limits = swarm["spec"]["limits"]
    assert limits["concurrency"] == 64 and limits["deadline_s"] == 120
    assert Decimal(str(limits["budget_usd"])) == Decimal("2.5")
    assert swarm["status"] == "succeeded"


async def test_the_callers_model_runs_every_worker(facade: Facade) -> None:
    """The planner hints other models (the simulator's plan alternates them); pinned by
    default, so the caller's cost guard, priced at its model, holds."""
    assert any(h != "kimi-k2.5" for h in PLAN_HINTS)
    swarm = await _swarm_of(facade, {})
    workers = [s for s in swarm["subtasks"] if s["kind"] == "worker"]
    assert len(workers) >= 2 and {s["model"] for s in workers} == {"kimi-k2.5"}, workers


async def test_auto_routing_follows_the_planners_hints(facade_sqlite: Facade) -> None:
    swarm = await _swarm_of(facade_sqlite, {"routing": "auto"})
    workers = [s for s in swarm["subtasks"] if s["kind"] == "worker"]
    assert {s["model"] for s in workers} == set(PLAN_HINTS[:len(workers)]), workers


async def test_approval_answers_202_with_the_held_swarms_id(facade: Facade) -> None:
    """With `agent_swarm.approval` a plan that needs approval answers at once: 202, an empty
    completion naming the swarm held (docs/OPENAI.md); the SDK reads it like any completion."""
    r = await facade.http.post("/v1/chat/completions", json={
        "model": "kimi-k2.5", "messages": TASK,
        "agent_swarm": {"enabled": True, "max_sub_agents": 3, "approval": "always"}})
    assert r.status_code == 202, r.text
    done = r.json()
    swarm_id = done["swarm_id"]
    assert done["swarm_status"] == "awaiting_approval"
    assert r.headers["location"] == f"/swarms/{swarm_id}"
    assert done["choices"][0]["message"]["content"] == ""
    assert done["choices"][0]["finish_reason"] == "stop"
    swarm = await facade.swarm(swarm_id)
    assert swarm["status"] == "awaiting_approval" and swarm["plan"]["agents"]
    assert done["usage"]["total_tokens"] > 0  # the planner's call, and only it
    assert {s["status"] for s in swarm["subtasks"] if s["kind"] == "worker"} == {"pending"}
    completion = await facade.sdk().chat.completions.create(
        model="kimi-k2.5", messages=[{"role": "user", "content": "Audit the ledger code"}],
        extra_body={"agent_swarm": {"enabled": True, "approval": {"above_agents": 0}}})
    assert getattr(completion, "swarm_status", None) == "awaiting_approval"
    held = await facade.swarm(getattr(completion, "swarm_id", ""))
    assert held["status"] == "awaiting_approval"
    rule = {"above_usd": "1000"}  # a plan under the rule runs and answers as ever
    r = await facade.http.post("/v1/chat/completions", json={
        "model": "kimi-k2.5", "messages": TASK,
        "agent_swarm": {"enabled": True, "max_sub_agents": 2, "approval": rule}})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
