"""The approval gate's pure part: the rules, the estimate a held swarm carries, the plan as
agents."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from app.db.history import Caps, History
from app.engine.approval import (
    asks,
    awaiting,
    decided,
    needed,
    plan_agents,
    run_clock_start,
    shown,
)
from app.engine.estimate import Plan, PlannedCall
from app.engine.estimate import estimate as figures
from app.engine.subtask_rows import new_subtask
from app.pricing import PriceTable
from app.schemas import SwarmCreate
from app.states import SubtaskKind

PRICES = PriceTable.builtin()


def worker(name: str, **kw: Any) -> Any:
    return new_subtask("s", name, 0, SubtaskKind.worker, kw.pop("model", "kimi-k2.5"),
                       kw.pop("max_tokens", 100), **kw)


def estimate(expected: str, agents: int) -> dict[str, Any]:
    return {"agents": agents, "cost_usd": {"expected": expected}}


@pytest.mark.parametrize("rule, expected, agents, held", [
    ("never", "9", 99, False),
    ("always", "0", 0, True),
    ({"above_usd": "2.50"}, "2.50", 1, False),  # above, not at
    ({"above_usd": "2.50"}, "2.500001", 1, True),
    ({"above_agents": 20}, "0", 20, False),
    ({"above_agents": 20}, "0", 21, True),
])
def test_rules(rule: Any, expected: str, agents: int, held: bool) -> None:
    limits = {"approval": rule}
    assert needed(limits, estimate(expected, agents)) is held
    assert asks(limits) is (rule != "never")


def test_the_rule_is_validated_as_a_request() -> None:
    ok = SwarmCreate.model_validate({"task": "t", "limits": {"approval": {"above_usd": "2.5"}}})
    assert ok.model_dump(mode="json")["limits"]["approval"] == {"above_usd": "2.5"}
    for bad in ("sometimes", {"above_usd": "-1"}, {"above_usd": "x"}, {"above_agents": -1},
                {"above_usd": "1", "above_agents": 2}, {"below_usd": "1"}):
        with pytest.raises(ValueError):
            SwarmCreate.model_validate({"task": "t", "limits": {"approval": bad}})


def test_the_held_estimate_is_the_routes_figures_with_the_agent_count() -> None:
    calls = [PlannedCall(n, SubtaskKind.worker, "kimi-k2.5", 100,
                         [{"role": "user", "content": f"say {n}"}]) for n in ("a", "b")]
    agents = [{"name": "a"}, {"name": "b"}]
    est = figures(Plan(calls, agents, {"a": [], "b": []}, 8), PRICES, History({}), Caps())
    held = shown(est)
    view = est.view()
    assert "plan" not in held and held["agents"] == 2
    assert {k: v for k, v in held.items() if k != "agents"} == {
        k: v for k, v in view.items() if k != "plan"}
    # the rule reads what the swarm shows: its expected cost, its agents
    expected = Decimal(held["cost_usd"]["expected"])
    assert expected < Decimal(held["cost_usd"]["max"])
    assert needed({"approval": {"above_usd": str(expected)}}, held) is False
    assert needed({"approval": {"above_usd": str(expected - Decimal("1e-7"))}}, held) is True
    assert needed({"approval": {"above_agents": 1}}, held) is True


def test_the_plan_is_postable_as_agents() -> None:
    planned = worker("p", prompt="do it", tools=["srv"], max_turns=4)
    planned.system_prompt = None  # a planned worker's: built from the task when called
    named = worker("n", system_prompt="you are n", depends_on=["p"], temperature=0.2)
    agents = plan_agents([planned, named], "the task")
    body = SwarmCreate.model_validate({"task": "the task", "agents": agents})
    assert [a.name for a in body.agents or []] == ["p", "n"]
    assert "the task" in agents[0]["system_prompt"]
    assert agents[0]["tools"] == ["srv"] and agents[0]["max_turns"] == 4
    assert "prompt" not in plan_agents([worker("q")], "t")[0]  # the task, by default
    fallback = worker("f")
    fallback.models = ["kimi-k2.5", "deepseek-v3.2"]
    assert plan_agents([fallback], "t")[0]["model"] == ["kimi-k2.5", "deepseek-v3.2"]


def test_the_deadline_runs_from_the_approval() -> None:
    start = datetime(2026, 12, 5, tzinfo=UTC)
    block, due = awaiting([], {}, start, 60)
    assert due == start + timedelta(seconds=60) and block["state"] == "awaiting"
    assert run_clock_start(block, start) == start
    later = start + timedelta(hours=2)
    assert run_clock_start(decided(block, "approved", later), start) == later
    assert run_clock_start(decided(block, "rejected", later), start) == start
