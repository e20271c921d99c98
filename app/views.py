"""The swarm resource (SPEC §3) assembled from rows: progress, usage and timing derived here."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pydantic_core

from app.db.live_rows import SubtaskView
from app.db.tables import Swarm
from app.db.types import utcnow
from app.engine import dag
from app.engine.subtask_rows import COMPRESSOR_PREFIX
from app.pricing import usd_str
from app.schemas import SubtaskRead
from app.states import SubtaskKind, SubtaskStatus


def _percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile."""
    if not sorted_values:
        return None
    rank = max(math.ceil(q / 100 * len(sorted_values)), 1)
    return round(sorted_values[rank - 1], 3)


def timing(swarm: Swarm, subtasks: Sequence[SubtaskView]) -> dict[str, Any]:
    """Wall time, the DAG's critical path (planner, workers, synthesis), serial sum, speedup."""
    latency: dict[str, float] = {}
    planners: list[str] = []
    for s in subtasks:
        if s.latency_ms is not None:
            latency[s.name] = s.latency_ms / 1000
        if s.kind == SubtaskKind.planner:
            planners.append(s.name)
    deps: dict[str, list[str]] = {}
    for s in subtasks:
        ds = list(s.depends_on) or (planners if s.kind == SubtaskKind.worker else [])
        if s.kind != SubtaskKind.compressor:
            # a compressed input reaches its consumer through its compressor
            ds += [f"{COMPRESSOR_PREFIX}{d}" for d in s.depends_on]
        deps[s.name] = ds
    known = deps.keys()
    deps = {n: [d for d in ds if d in known] for n, ds in deps.items()}
    critical = dag.critical_path(deps, latency)
    serial = sum(latency.values())
    wall: float | None = None
    if swarm.started_at is not None:
        end = swarm.finished_at or utcnow()
        wall = max((end - swarm.started_at).total_seconds(), 0.0)
    values = sorted(latency.values())
    return {
        "wall_s": None if wall is None else round(wall, 3),
        "critical_path_s": round(critical, 3),
        "serial_s": round(serial, 3),
        "speedup": round(serial / wall, 2) if wall else None,
        "subtask_latency_s": {"p50": _percentile(values, 50), "p95": _percentile(values, 95),
                              "p99": _percentile(values, 99)},
    }


def subtask_fields(s: SubtaskView, with_output: bool) -> dict[str, Any]:
    """A subtask's view as the fields of SubtaskRead."""
    return {
        # the statuses as plain str: pydantic-core writes a str subclass (StrEnum) by a
        # fallback path, slower than the whole row otherwise
        "name": s.name, "kind": str(s.kind), "status": str(s.status), "model": s.model,
        "depends_on": s.depends_on, "attempts": s.attempts,
        "output": s.output if with_output else None, "truncated": s.truncated,
        "reused": bool(s.reused), "sanitized": bool(s.sanitized), "error": s.error,
        "usage": {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
                  "cost_usd": usd_str(s.cost_usd)},
        "latency_ms": s.latency_ms, "started_at": s.started_at, "finished_at": s.finished_at,
        "turns": s.turns, "tool_calls": s.tool_calls, "fallbacks": s.fallbacks,
        "output_json": s.output_json if with_output else None,
        "output_status": s.output_status, "output_format": s.output_format,
    }


def subtask_read(s: SubtaskView, with_output: bool) -> SubtaskRead:
    return SubtaskRead.model_validate(subtask_fields(s, with_output))


def swarm_json(swarm: Swarm, subtasks: Sequence[SubtaskView], *, with_outputs: bool = True,
               with_result: bool | None = None, queue_position: int | None = None,
               retried_by: str | None = None) -> bytes:
    """The resource as JSON; lists omit outputs and result, webhooks omit only subtask
    outputs."""
    return to_json(swarm_fields(swarm, subtasks, with_outputs=with_outputs,
                                with_result=with_result, queue_position=queue_position,
                                retried_by=retried_by))


def to_json(fields: dict[str, Any]) -> bytes:
    """Fields as SwarmRead (or a list of them) would serialize them, without building the
    models, a fraction of the time (docs/decisions/0013-views-without-models.md). The fields
    are built here from typed rows, and the tests check the bytes against the models' own
    serialization (tests/api/test_api_routes.py)."""
    return pydantic_core.to_json(fields, inf_nan_mode="null")  # as SwarmRead serializes them


def swarm_fields(swarm: Swarm, subtasks: Sequence[SubtaskView], *, with_outputs: bool = True,
                 with_result: bool | None = None, queue_position: int | None = None,
                 retried_by: str | None = None) -> dict[str, Any]:
    """The fields of SwarmRead."""
    progress = {"total": len(subtasks), **dict.fromkeys(_PROGRESS, 0)}  # Progress's order
    progress.update(Counter(s.status for s in subtasks))
    return {
        "id": swarm.id, "status": str(swarm.status), "created_at": swarm.created_at,
        "started_at": swarm.started_at, "finished_at": swarm.finished_at, "task": swarm.task,
        "metadata": swarm.meta,
        "spec": {"task": swarm.task, **swarm.spec},  # the task is stored once, beside the spec
        "progress": progress,
        "subtasks": [subtask_fields(s, with_outputs) for s in subtasks],
        "usage": {"prompt_tokens": swarm.prompt_tokens,
                  "completion_tokens": swarm.completion_tokens,
                  "cost_usd": usd_str(swarm.spent_usd), "gateway_calls": swarm.gateway_calls,
                  "unresolved_usd": usd_str(swarm.unresolved_usd)},
        "timing": timing(swarm, subtasks),
        "queue_position": queue_position,
        "result": swarm.result if (with_outputs if with_result is None else with_result)
        else None,
        "error": swarm.error,
        "vote": swarm.vote,
        "retry_of": swarm.retry_of,
        "retried_by": retried_by,
        "erased": swarm.erased_at is not None,
        **_approval_fields(swarm.approval),
    }


def _approval_fields(block: dict[str, Any] | None) -> dict[str, Any]:
    """The plan and estimate of a swarm that asked for approval (SPEC §14)."""
    if not block:
        return {"plan": None, "estimate": None}
    return {"plan": block.get("plan"), "estimate": block.get("estimate")}


_PROGRESS = tuple(s.value for s in SubtaskStatus)
