"""Bodies `POST /swarms` must refuse, each with its status, error code and the field named
(tests/api/test_api_validation.py checks them; tests/perf/test_request_parser.py sends them to
FastAPI's parsing too)."""

from __future__ import annotations

import json
from typing import Any

A = [{"name": "a"}]


def body_with(**kw: Any) -> dict[str, Any]:
    return {"task": "t", "agents": A, **kw}


def agent_with(**kw: Any) -> dict[str, Any]:
    return {"task": "t", "agents": [{"name": "a", **kw}]}


# (id, body, status, code, field)
REJECTED: list[tuple[str, Any, int, str, str]] = [
    # unknown fields anywhere
    ("unknown-top", body_with(bogus=1), 422, "validation_error", "bogus"),
    ("unknown-agent", agent_with(bogus=1), 422, "validation_error", "agents.0.bogus"),
    ("unknown-limits", body_with(limits={"bogus": 1}), 422, "validation_error", "limits.bogus"),
    ("unknown-synthesis", body_with(synthesis={"bogus": 1}), 422, "validation_error",
     "synthesis.bogus"),
    ("unknown-orchestrator", body_with(orchestrator={"bogus": 1}), 422, "validation_error",
     "orchestrator.bogus"),
    # dependencies and names
    ("unknown-dep", {"task": "t", "agents": [{"name": "a"}, {"name": "b", "depends_on": ["zz"]}]},
     422, "unknown_dependency", "agents.1.depends_on"),
    ("duplicate-name", {"task": "t", "agents": [{"name": "a"}, {"name": "b"}, {"name": "a"}]},
     422, "duplicate_agent_name", "agents.2.name"),
    ("name-empty", agent_with(name=""), 422, "validation_error", "agents.0.name"),
    ("name-65", agent_with(name="a" * 65), 422, "validation_error", "agents.0.name"),
    ("name-space", agent_with(name="a b"), 422, "validation_error", "agents.0.name"),
    ("name-unicode", agent_with(name="agënt"), 422, "validation_error", "agents.0.name"),
    ("name-cjk", agent_with(name="代理"), 422, "validation_error", "agents.0.name"),
    ("name-slash", agent_with(name="a/b"), 422, "validation_error", "agents.0.name"),
    ("name-newline", agent_with(name="a\n"), 422, "validation_error", "agents.0.name"),
    ("name-number", agent_with(name=5), 422, "validation_error", "agents.0.name"),
    ("dep-bad-name", agent_with(depends_on=["a b"]), 422, "validation_error",
     "agents.0.depends_on.0"),
    ("agent-no-name", {"task": "t", "agents": [{"system_prompt": "x"}]}, 422,
     "validation_error", "agents.0.name"),
    ("too-many-agents", {"task": "t", "agents": [{"name": f"a{i}"} for i in range(4)]},
     422, "too_many_agents", "agents"),
    ("agents-empty", body_with(agents=[]), 422, "validation_error", "agents"),
    # limits
    ("budget-zero", body_with(limits={"budget_usd": 0}), 422, "validation_error",
     "limits.budget_usd"),
    ("budget-negative", body_with(limits={"budget_usd": -1}), 422, "validation_error",
     "limits.budget_usd"),
    ("budget-string", body_with(limits={"budget_usd": "lots"}), 422, "validation_error",
     "limits.budget_usd"),
    # what Decimal reads but the documented pattern (a plain decimal) does not say
    ("budget-underscore", body_with(limits={"budget_usd": "1_000"}), 422, "validation_error",
     "limits.budget_usd"),
    ("budget-non-ascii-digit", body_with(limits={"budget_usd": "\u0661"}), 422,
     "validation_error", "limits.budget_usd"),
    ("budget-empty-string", body_with(limits={"budget_usd": ""}), 422, "validation_error",
     "limits.budget_usd"),
    ("tolerance-negative", body_with(limits={"failure_tolerance": -0.01}), 422, "validation_error",
     "limits.failure_tolerance"),
    ("tolerance-over-1", body_with(limits={"failure_tolerance": 1.01}), 422, "validation_error",
     "limits.failure_tolerance"),
    # max_tokens at every level
    ("max-tokens-top-0", body_with(max_tokens=0), 422, "validation_error", "max_tokens"),
    ("max-tokens-top-big", body_with(max_tokens=128_001), 422, "validation_error", "max_tokens"),
    ("max-tokens-agent-0", agent_with(max_tokens=0), 422, "validation_error",
     "agents.0.max_tokens"),
    ("max-tokens-agent-big", agent_with(max_tokens=128_001), 422, "validation_error",
     "agents.0.max_tokens"),
    ("max-tokens-synthesis-0", body_with(synthesis={"max_tokens": 0}), 422, "validation_error",
     "synthesis.max_tokens"),
    ("max-tokens-synthesis-big", body_with(synthesis={"max_tokens": 128_001}), 422,
     "validation_error", "synthesis.max_tokens"),
    ("max-tokens-huge-int", body_with(max_tokens=10**30), 422, "validation_error", "max_tokens"),
    ("max-tokens-float", body_with(max_tokens=1.5), 422, "validation_error", "max_tokens"),
    # unknown models
    ("model-top", body_with(model="gpt-9000"), 422, "unknown_model", "model"),
    ("model-agent", {"task": "t", "agents": [{"name": "a"}, {"name": "b", "model": "gpt-9000"}]},
     422, "unknown_model", "agents.1.model"),
    ("model-synthesis", body_with(synthesis={"model": "gpt-9000"}), 422, "unknown_model",
     "synthesis.model"),
    ("model-orchestrator", body_with(orchestrator={"model": "gpt-9000"}), 422, "unknown_model",
     "orchestrator.model"),
    # the task
    ("task-empty", body_with(task=""), 422, "validation_error", "task"),
    ("task-blank", body_with(task=" \n\t "), 422, "validation_error", "task"),
    ("task-missing", {"agents": A}, 422, "validation_error", "task"),
    ("task-number", body_with(task=5), 422, "validation_error", "task"),
    ("task-null", body_with(task=None), 422, "validation_error", "task"),
    ("task-nul-char", body_with(task="a\x00b"), 422, "validation_error", "task"),
    # wrong JSON types
    ("agents-object", body_with(agents={"a": {}}), 422, "validation_error", "agents"),
    ("agents-string", body_with(agents="a"), 422, "validation_error", "agents"),
    ("limits-list", body_with(limits=[1]), 422, "validation_error", "limits"),
    ("metadata-list", body_with(metadata=[1]), 422, "validation_error", "metadata"),
    ("depends-on-string", agent_with(depends_on="b"), 422, "validation_error",
     "agents.0.depends_on"),
    ("strategy-unknown", body_with(synthesis={"strategy": "magic"}), 422, "validation_error",
     "synthesis.strategy"),
    ("temperature-high", body_with(temperature=2.5), 422, "validation_error", "temperature"),
    # a number is a JSON number: not `true` (lax mode read 1) nor a numeric string
    ("max-tokens-string", body_with(max_tokens="100"), 422, "validation_error", "max_tokens"),
    ("max-tokens-true", body_with(max_tokens=True), 422, "validation_error", "max_tokens"),
    ("temperature-string", body_with(temperature="0.3"), 422, "validation_error", "temperature"),
    ("weight-string", agent_with(weight="2"), 422, "validation_error", "agents.0.weight"),
    ("max-turns-true", agent_with(max_turns=True), 422, "validation_error", "agents.0.max_turns"),
    ("agent-max-tokens-string", agent_with(max_tokens="9"), 422, "validation_error",
     "agents.0.max_tokens"),
    ("synthesis-max-tokens-true", body_with(synthesis={"max_tokens": True}), 422,
     "validation_error", "synthesis.max_tokens"),
    ("max-subtasks-string", body_with(orchestrator={"max_subtasks": "4"}), 422,
     "validation_error", "orchestrator.max_subtasks"),
    ("max-depth-false", body_with(orchestrator={"max_depth": False}), 422, "validation_error",
     "orchestrator.max_depth"),
    ("concurrency-string", body_with(limits={"concurrency": "8"}), 422, "validation_error",
     "limits.concurrency"),
    ("max-attempts-true", body_with(limits={"max_attempts": True}), 422, "validation_error",
     "limits.max_attempts"),
    ("tolerance-string", body_with(limits={"failure_tolerance": "0.5"}), 422, "validation_error",
     "limits.failure_tolerance"),
    ("timeout-string", body_with(limits={"subtask_timeout_s": "60"}), 422, "validation_error",
     "limits.subtask_timeout_s"),
    ("deadline-true", body_with(limits={"deadline_s": True}), 422, "validation_error",
     "limits.deadline_s"),
    ("tool-calls-string", body_with(limits={"max_tool_calls": "5"}), 422, "validation_error",
     "limits.max_tool_calls"),
    ("budget-true", body_with(limits={"budget_usd": True}), 422, "validation_error",
     "limits.budget_usd"),
    ("body-list", [1, 2], 422, "validation_error", "body"),
    ("body-null", None, 422, "validation_error", "body"),
    ("body-string", "task", 422, "validation_error", "body"),
    ("body-number", 3, 422, "validation_error", "body"),
    # what the database could not store must not become a 500
    ("metadata-deep", body_with(metadata={"k": json.loads("[" * 40 + "]" * 40)}), 422,
     "validation_error", "metadata"),
    ("prompt-nul-char", agent_with(system_prompt="x\x00"), 422, "validation_error",
     "agents.0.system_prompt"),
]
