"""The simulator's plans (the orchestrator's JSON): valid DAGs the engine accepts, sized and
bounded as the prompt asks, shaped by directives, and the bad plans (too many, too deep,
unparseable) that fail the engine's validation until a repair."""

from __future__ import annotations

import graphlib
import json
from typing import Any

import httpx
import pytest

from app.engine.planner import PlanInvalid, parse_plan, planner_messages
from app.simulator import PLAN_HINTS
from tests.simulator_support import URL


async def plan(client: httpx.AsyncClient, task: str, key: str | None = None, **extra: Any) -> Any:
    messages = [{"role": "system", "content": "You are the orchestrator."},
                {"role": "user", "content": task}]
    body = {"model": "kimi-k2.5", "messages": messages, "max_tokens": 2000,
            "response_format": {"type": "json_object"}, **extra}
    resp = await client.post(URL, json=body, headers={"Idempotency-Key": key} if key else {})
    assert resp.status_code == 200
    return resp.json()


def check_plan(subtasks: list[dict[str, Any]]) -> None:
    """Raise unless the plan is one the engine would accept."""
    ids = [s["id"] for s in subtasks]
    assert subtasks and len(set(ids)) == len(ids)
    assert all(d in ids for s in subtasks for d in s["depends_on"])
    tuple(graphlib.TopologicalSorter({s["id"]: s["depends_on"] for s in subtasks}).static_order())



async def test_default_plan_is_valid(client: httpx.AsyncClient) -> None:
    body = await plan(client, "Review the payment service migration [[sim latency_ms=0]]")
    assert body["choices"][0]["finish_reason"] == "stop"
    subtasks = json.loads(body["choices"][0]["message"]["content"])["subtasks"]
    check_plan(subtasks)
    assert len(subtasks) == 4 and subtasks[0]["id"] == "research_1"
    assert [s["depends_on"] for s in subtasks[:3]] == [[], [], []]
    assert subtasks[3]["depends_on"] == [subtasks[0]["id"], subtasks[1]["id"]]
    assert all(s["model_hint"] in PLAN_HINTS for s in subtasks)
    assert all("payment service migration" in s["description"] for s in subtasks)
    assert not any("[[sim" in s["description"] for s in subtasks)


async def test_plan_size(client: httpx.AsyncClient) -> None:
    body = await plan(client, "Audit the service [[sim plan_size=7]]")
    subtasks = json.loads(body["choices"][0]["message"]["content"])["subtasks"]
    check_plan(subtasks)
    assert len(subtasks) == 7


async def planner_call(client: httpx.AsyncClient, task: str, max_subtasks: int,
                       max_depth: int) -> str:
    """The simulator's answer to the engine's own planning prompt."""
    messages = planner_messages(task, max_subtasks, max_depth, list(PLAN_HINTS))
    body = await plan(client, task, messages=messages)
    content: str = body["choices"][0]["message"]["content"]
    return content


@pytest.mark.parametrize(("max_subtasks", "max_depth"), [(1, 1), (2, 1), (3, 2), (3, 3), (8, 1)])
async def test_plan_keeps_to_the_prompts_bounds(client: httpx.AsyncClient, max_subtasks: int,
                                                max_depth: int) -> None:
    content = await planner_call(client, "Audit the service", max_subtasks, max_depth)
    plan_ = parse_plan(content, "stop", max_subtasks, max_depth)  # what the engine accepts
    assert len(plan_) == min(4, max_subtasks)


async def test_plan_directives_still_shape_a_bounded_plan(client: httpx.AsyncClient) -> None:
    """`plan_size` and the flaws still win over the prompt's bounds, whatever they are."""
    for task, bounds, reason in (("[[sim plan=too_many]]", (2, 2), "too_many"),
                                 ("[[sim plan=too_many]]", (200, 3), "too_many"),
                                 ("[[sim plan_size=3]]", (2, 2), "too_many"),
                                 ("[[sim plan=too_deep]]", (20, 2), "too_deep"),
                                 ("[[sim plan=too_deep]]", (30, 15), "too_deep"),
                                 ("[[sim plan=cyclic]]", (3, 3), "cycle")):
        content = await planner_call(client, task, *bounds)
        with pytest.raises(PlanInvalid) as exc:
            parse_plan(content, "stop", *bounds)
        assert exc.value.reason == reason, (task, bounds)


@pytest.mark.parametrize("kind", ["cyclic", "unknown_dep", "empty", "duplicate"])
async def test_bad_plans_fail_validation(client: httpx.AsyncClient, kind: str) -> None:
    body = await plan(client, f"Audit the service [[sim plan={kind}]]")
    subtasks = json.loads(body["choices"][0]["message"]["content"])["subtasks"]
    with pytest.raises((AssertionError, graphlib.CycleError)):
        check_plan(subtasks)


async def test_plan_too_many_and_too_deep(client: httpx.AsyncClient) -> None:
    many = await plan(client, "[[sim plan=too_many]]")
    deep = await plan(client, "[[sim plan=too_deep]]")
    many_tasks = json.loads(many["choices"][0]["message"]["content"])["subtasks"]
    deep_tasks = json.loads(deep["choices"][0]["message"]["content"])["subtasks"]
    check_plan(many_tasks)
    check_plan(deep_tasks)
    assert len(many_tasks) > 50
    assert len(deep_tasks) > 8 and all(s["depends_on"] for s in deep_tasks[1:])


@pytest.mark.parametrize("kind", ["truncated", "not_json"])
async def test_unparseable_plans(client: httpx.AsyncClient, kind: str) -> None:
    body = await plan(client, f"Audit [[sim plan={kind}]]")
    with pytest.raises(json.JSONDecodeError):
        json.loads(body["choices"][0]["message"]["content"])
    if kind == "truncated":
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 2000


@pytest.mark.parametrize("keys", [("sw1:planner:1", "sw1:planner_repair:1"), (None, None)])
async def test_plan_times_lets_the_repair_succeed(
    client: httpx.AsyncClient, keys: tuple[str | None, str | None]
) -> None:
    first = await plan(client, "Audit [[sim plan=cyclic plan_times=1]]", key=keys[0])
    repair = await plan(client, "Audit [[sim plan=cyclic plan_times=1]] (fix the cycle)",
                        key=keys[1])
    with pytest.raises(graphlib.CycleError):
        check_plan(json.loads(first["choices"][0]["message"]["content"])["subtasks"])
    check_plan(json.loads(repair["choices"][0]["message"]["content"])["subtasks"])
