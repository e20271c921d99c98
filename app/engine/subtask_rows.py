"""Factories for subtask rows: workers, the planner, the synthesizer, compressors."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from app.db.live_rows import LiveSubtask, new_live_subtask
from app.schemas import model_chain
from app.states import SubtaskKind, SubtaskStatus

PLANNER = "@planner"
SYNTHESIZER = "@synthesizer"
COMPRESSOR_PREFIX = "@compress."  # '@' never starts an agent name: no collisions


def new_subtask(swarm_id: str, name: str, position: int, kind: SubtaskKind,
                model: str | list[str], max_tokens: int, *, depends_on: list[str] | None = None,
                system_prompt: str | None = "", prompt: str | None = None,
                temperature: float | None = None, weight: float = 1.0,
                tools: list[str] | None = None, max_turns: int = 8) -> LiveSubtask:
    """A pending subtask with zeroed usage, live (every column set: it is inserted with Core,
    and the engine runs it as it is).

    `prompt` None is the swarm's task, and a worker's `system_prompt` None the planned
    workers' one (built from the task): resolved when the call is made, so the task is never
    copied into a subtask. `model` may list models to fall back on: the first runs first."""
    chain = model_chain(model)
    # not through the declarative constructor's attribute events, which cost wide swarms'
    # creation an order of magnitude more (docs/decisions/0011-live-rows.md); nothing is
    # lost: a new subtask never joins a session
    return new_live_subtask(
        **_PENDING, swarm_id=swarm_id, name=name, position=position, kind=kind,
        model=chain[0], models=chain if len(chain) > 1 else None,
        depends_on=list(depends_on or []), system_prompt=system_prompt, prompt=prompt,
        max_tokens=max_tokens, temperature=temperature, weight=weight,
        tools=list(tools or []), max_turns=max_turns)


# the columns every new subtask starts with (immutable values: shared by every row)
_PENDING: dict[str, Any] = {
    "fallbacks": 0, "status": SubtaskStatus.pending, "attempts": 0, "output": None,
    "error": None, "truncated": False, "sanitized": False, "prompt_tokens": 0,
    "completion_tokens": 0, "cost_usd": Decimal(0), "latency_ms": None, "ready_at": None,
    "started_at": None, "finished_at": None, "reused": False, "turns": 0, "tool_calls": 0,
    "output_json": None, "output_status": None, "output_format": None}


def synthesizer_for(swarm_id: str, spec: dict[str, Any], position: int,
                    workers: list[str]) -> LiveSubtask | None:
    """The synthesizer after `workers`, when the swarm's strategy asks for one (the same for
    explicit agents at creation and for a plan's workers)."""
    if spec["synthesis"]["strategy"] != "synthesize":
        return None
    return synthesizer(swarm_id, spec, position, workers)


def synthesizer(swarm_id: str, spec: dict[str, Any], position: int,
                workers: list[str]) -> LiveSubtask:
    """The synthesizer merging `workers`' results (also a vote's, when no two agree)."""
    return new_subtask(swarm_id, SYNTHESIZER, position, SubtaskKind.synthesizer,
                       spec["synthesis"]["model"], spec["synthesis"]["max_tokens"],
                       depends_on=workers, temperature=spec.get("temperature"))
