"""Plan validation (planner.parse_plan): every reason a plan is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.engine.planner import PlanInvalid, parse_plan


def plan(*items: dict[str, Any]) -> str:
    return json.dumps({"subtasks": list(items)})


def item(sid: str, *deps: str, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "description": f"do {sid}", "depends_on": list(deps), **extra}


def test_a_valid_plan_is_parsed() -> None:
    got = parse_plan(plan(item("a"), item("b", "a", "a"), item("c", model_hint=3)), "stop", 5, 3)
    assert [p.id for p in got] == ["a", "b", "c"]
    assert got[1].depends_on == ("a",)  # duplicates folded
    assert got[2].model_hint is None  # a non-string hint is ignored


@pytest.mark.parametrize("fenced", [
    "```json\n{doc}\n```", "```\n{doc}\n```", "  ```JSON \n{doc}\n  ```\n",
])
def test_a_plan_in_a_code_fence_is_read(fenced: str) -> None:
    """Models fence their JSON even when asked for an object: read what is inside."""
    got = parse_plan(fenced.replace("{doc}", plan(item("a"), item("b", "a"))), "stop", 5, 3)
    assert [p.id for p in got] == ["a", "b"]


@pytest.mark.parametrize(("content", "finish", "reason"), [
    (plan(item("a")), "length", "truncated"),
    ("not json", "stop", "not_json"),
    ("```json\n" + plan(item("a")), "stop", "not_json"),  # a fence never closed
    ("Here is the plan:\n```json\n" + plan(item("a")) + "\n```", "stop", "not_json"),
    ("[1, 2]", "stop", "wrong_shape"),
    (json.dumps({"subtasks": "x"}), "stop", "wrong_shape"),
    (plan(), "stop", "empty"),
    (plan(*[item(f"s{i}") for i in range(6)]), "stop", "too_many"),
    (plan({"id": "bad id!", "description": "x"}), "stop", "bad_id"),
    (plan({"id": "a\n", "description": "x"}), "stop", "bad_id"),  # `$` alone would pass it
    (plan({"id": "a"}), "stop", "wrong_shape"),
    (plan(item("a"), item("a")), "stop", "duplicate_id"),
    (plan(item("a", "ghost")), "stop", "unknown_dependency"),
    (plan(item("a", "b"), item("b", "a")), "stop", "cycle"),
    (plan(item("a"), item("b", "a"), item("c", "b"), item("d", "c")), "stop", "too_deep"),
])
def test_each_invalid_plan_names_its_reason(content: str, finish: str, reason: str) -> None:
    with pytest.raises(PlanInvalid) as exc:
        parse_plan(content, finish, 5, 3)
    assert exc.value.reason == reason
    assert exc.value.details["reason"] == reason
