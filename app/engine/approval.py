"""The approval gate's pure part (SPEC §14): whether a swarm's limits ask for approval and
whether its estimate (`forecast`'s, the figures `POST /swarms/estimate` shows) needs it, the
plan as postable agents, and the block a swarm carries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from app.db.tables import Subtask, Swarm
from app.engine.estimate import Estimate
from app.engine.planner import worker_system_prompt
from app.states import SubtaskKind, SwarmStatus


def shown(est: Estimate) -> dict[str, Any]:
    """The estimate a held swarm carries (and its event): `POST /swarms/estimate`'s figures,
    with the plan's agent count in place of the plan (the swarm shows that beside it)."""
    figures = est.view()
    del figures["plan"]
    return {"agents": len(est.agents), **figures}


def asks(limits: Mapping[str, Any]) -> bool:
    """Whether the swarm's limits name any approval rule (`never` is none)."""
    return bool(limits.get("approval", "never") != "never")


def needed(limits: Mapping[str, Any], estimate: Mapping[str, Any]) -> bool:
    """Whether this estimate needs a person's approval under the swarm's limits."""
    rule = limits.get("approval", "never")
    if rule == "always":
        return True
    if isinstance(rule, Mapping) and "above_usd" in rule:  # the expected cost, not the max
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
