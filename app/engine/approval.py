"""The approval gate's pure part (SPEC §14): a plan's worst case from the price table, whether
its limits ask for approval, the plan as postable agents, and the block a swarm carries.

`worst_case` is the one estimate the gate asks for; a history-based estimator can take its
place behind the same call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from app.db.tables import Subtask, Swarm
from app.engine import dag
from app.engine.context import estimate_prompt_tokens, with_dependencies
from app.engine.estimate import width_of
from app.engine.planner import worker_system_prompt
from app.engine.synthesis import SYNTHESIZER_SYSTEM, WorkerResult, synthesis_prompt
from app.pricing import PriceTable, usd_str
from app.states import SubtaskKind, SubtaskStatus, SwarmStatus

# an answer's bytes per token, for the outputs a dependent or the synthesizer receives: the
# reservation counts prompt bytes (context.estimate_prompt_tokens), not tokens
_BYTES_PER_TOKEN = 4


def _own_prompt(sub: Subtask, task: str) -> list[dict[str, str]]:
    """The messages of a subtask's first call with its dependencies' outputs empty (their
    names and the wording around them in place)."""
    if sub.kind is SubtaskKind.synthesizer:
        system = sub.system_prompt or SYNTHESIZER_SYSTEM
        user = synthesis_prompt(task, [WorkerResult(d, "", 1.0, False) for d in sub.depends_on],
                                [])
    else:
        system = (sub.system_prompt if sub.system_prompt is not None
                  else worker_system_prompt(task))
        user = with_dependencies(task if sub.prompt is None else sub.prompt,
                                 [(d, "") for d in sub.depends_on])
    return ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}]


def worst_case(subtasks: Sequence[Subtask], task: str, prices: PriceTable) -> dict[str, Any]:
    """What the pending workers and synthesizer of a plan would cost: `max` is the sum of the
    reservations their calls make (every prompt token at the input price, `max_tokens` of
    output; a dependent's prompt holds its dependencies' whole outputs; a tool agent makes up
    to `max_turns` calls), `expected` each subtask's own prompt and `max_tokens` in one call.
    No history here: p90 is the max."""
    plan = [s for s in subtasks if s.status is SubtaskStatus.pending
            and s.kind in (SubtaskKind.worker, SubtaskKind.synthesizer)]
    by_name = {s.name: s for s in plan}
    expected_usd = max_usd = Decimal(0)
    expected_tokens = max_tokens = calls = max_calls = 0
    for s in plan:
        price = prices[s.model]
        own = estimate_prompt_tokens(_own_prompt(s, task))
        inputs = sum(by_name[d].max_tokens * _BYTES_PER_TOKEN
                     for d in s.depends_on if d in by_name)
        turns = s.max_turns if s.tools else 1
        expected_usd += price.worst_case(own, s.max_tokens)
        expected_tokens += own + s.max_tokens
        # each turn's prompt holds the turns before it: the last one bounds them all
        call_max = price.worst_case(own + inputs + (turns - 1) * s.max_tokens, s.max_tokens)
        max_usd += call_max * turns
        max_tokens += (own + inputs + (turns - 1) * s.max_tokens + s.max_tokens) * turns
        calls += 1
        max_calls += turns
    workers = {s.name: [d for d in s.depends_on if d in by_name]
               for s in plan if s.kind is SubtaskKind.worker}
    return {
        "agents": len(workers), "width": width_of(workers), "depth": dag.depth(workers),
        "calls": {"expected": calls, "max": max_calls},
        "tokens": {"expected": expected_tokens, "max": max_tokens},
        "cost_usd": {"expected": usd_str(expected_usd), "p90": usd_str(max_usd),
                     "max": usd_str(max_usd)},
        "reservation_usd": usd_str(max_usd),
        "basis": {"samples": 0, "since": None},
    }


def asks(limits: Mapping[str, Any]) -> bool:
    """Whether the swarm's limits name any approval rule (`never` is none)."""
    return bool(limits.get("approval", "never") != "never")


def needed(limits: Mapping[str, Any], estimate: Mapping[str, Any]) -> bool:
    """Whether this estimate needs a person's approval under the swarm's limits."""
    rule = limits.get("approval", "never")
    if rule == "always":
        return True
    if isinstance(rule, Mapping) and "above_usd" in rule:
        return Decimal(estimate["cost_usd"]["expected"]) > Decimal(str(rule["above_usd"]))
    if isinstance(rule, Mapping) and "above_agents" in rule:
        return int(estimate["agents"]) > int(rule["above_agents"])
    return False


def plan_agents(subtasks: Sequence[Subtask], task: str) -> list[dict[str, Any]]:
    """The workers as a request's `agents` (postable as they are): a planned worker's system
    prompt, built from the task when it is called, is written out."""
    agents: list[dict[str, Any]] = []
    for s in sorted(subtasks, key=lambda s: s.position):
        if s.kind is not SubtaskKind.worker:
            continue
        agent: dict[str, Any] = {
            "name": s.name,
            "system_prompt": (s.system_prompt if s.system_prompt is not None
                              else worker_system_prompt(task)),
            # a fallback list as the request gave it (SPEC §15)
            "model": list(s.models) if s.models else s.model, "max_tokens": s.max_tokens,
            "depends_on": list(s.depends_on)}
        if s.prompt is not None:
            agent["prompt"] = s.prompt
        if s.tools:
            agent["tools"], agent["max_turns"] = list(s.tools), s.max_turns
        if s.temperature is not None:
            agent["temperature"] = s.temperature
        if s.weight != 1.0:
            agent["weight"] = s.weight
        agents.append(agent)
    return agents


def awaiting(agents: list[dict[str, Any]], estimate: dict[str, Any], now: datetime,
             timeout_s: float) -> tuple[dict[str, Any], datetime]:
    """The block of a swarm that waits for approval, and when it times out."""
    due = now + timedelta(seconds=timeout_s)
    return ({"state": "awaiting", "plan": {"agents": agents}, "estimate": estimate,
             "requested_at": now.isoformat(), "due_at": due.isoformat()}, due)


def decided(block: Mapping[str, Any] | None, state: str, now: datetime,
            **more: Any) -> dict[str, Any]:
    """The block after a decision: `approved`, `rejected` or `timed_out`."""
    return {**(block or {}), "state": state, "decided_at": now.isoformat(), **more}


def requeued(swarm: Swarm) -> bool:
    """A swarm queued again by its approval: its first claim since is no takeover, though
    an earlier owner planned it and let it go."""
    return (swarm.status is SwarmStatus.queued
            and (swarm.approval or {}).get("state") == "approved")


def run_clock_start(block: Mapping[str, Any] | None, started_at: datetime) -> datetime:
    """Where a swarm's deadline runs from: its start, or its approval when that came later
    (the wait for a person is not the run's time)."""
    at = (block or {}).get("decided_at")
    if (block or {}).get("state") != "approved" or not isinstance(at, str):
        return started_at
    return max(started_at, datetime.fromisoformat(at))
