"""The orchestrator's plan: its prompt, its repair prompt, and validation with precise reasons.
Pure functions, no IO."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.engine import dag
from app.schemas import NAME_PATTERN
from app.text import storable

ID_PATTERN = re.compile(NAME_PATTERN)  # a subtask id is an agent name
JSON_OBJECT = {"type": "json_object"}


@dataclass(frozen=True, slots=True)
class PlannedSubtask:
    id: str
    description: str
    depends_on: tuple[str, ...]
    model_hint: str | None
    tools: tuple[str, ...] = ()


class PlanInvalid(ValueError):
    """Why a plan cannot run: `reason` is one of truncated, not_json, wrong_shape, empty,
    bad_id, duplicate_id, unknown_dependency, cycle, too_many, too_deep, unknown_tool."""

    def __init__(self, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.details = {"reason": reason, **details}


def planner_max_tokens(max_subtasks: int) -> int:
    """Room for a plan of max_subtasks entries (about 150 tokens each)."""
    return min(max(1000, 150 * max_subtasks), 128_000)


TOOLS_LINE = "Tools you may give a subtask (its optional \"tools\" list): "


def planner_messages(task: str, max_subtasks: int, max_depth: int, models: Sequence[str],
                     guidance: str = "", tools: Sequence[str] = ()) -> list[dict[str, str]]:
    """The orchestrator's request; `guidance` (orchestrator.system_prompt) follows our rules;
    `tools` are the ones it may hand to subtasks."""
    system = (
        "You are the orchestrator of a team of sub-agents. Split the user's task into "
        "independent subtasks that sub-agents can work on in parallel; add dependencies only "
        "where a subtask needs another's result.\n"
        "Answer with one JSON object and nothing else, of the shape:\n"
        '{"subtasks": [{"id": "short_id", "description": "what this sub-agent must do", '
        '"depends_on": ["other_id"], "model_hint": "model"}]}\n'
        f"Rules: at most {max_subtasks} subtasks; ids match [A-Za-z0-9_.-]{{1,64}} and are "
        "unique; depends_on names only ids of this plan; dependencies are acyclic; the longest "
        f"dependency chain has at most {max_depth} subtasks; model_hint is optional and one of: "
        + ", ".join(models) + "."
    )
    if tools:
        system += ("\n" + TOOLS_LINE + ", ".join(tools) + ". A subtask that must look things "
                   'up or act gets "tools": [...] naming some of them; others get none.')
    if guidance.strip():
        system += f"\n\nGuidance from the caller:\n{guidance}"
    return [{"role": "system", "content": system}, {"role": "user", "content": task}]


def repair_messages(first: Sequence[dict[str, str]], faulty: str,
                    error: PlanInvalid) -> list[dict[str, str]]:
    """The one repair call: the original request, the faulty answer, and what is wrong."""
    return [*first, {"role": "assistant", "content": faulty},
            {"role": "user", "content": f"That plan is invalid: {error}. Answer again with the "
                                        "corrected JSON object only."}]


def tool_allowed(selector: str, allowed: Sequence[str]) -> bool:
    """`server.tool` is allowed by itself or by its server; `server` only by itself."""
    return selector in allowed or ("." in selector and selector.partition(".")[0] in allowed)


def _tools(raw: Any, sid: str, allowed: Sequence[str]) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
        raise PlanInvalid("wrong_shape", f"subtask {sid!r}: tools must be a list of names",
                          id=sid)
    for t in raw:
        if not tool_allowed(t, allowed):
            raise PlanInvalid("unknown_tool", f"subtask {sid!r} names tool {t!r}, which is not "
                              f"among the tools offered ({', '.join(allowed) or 'none'})",
                              id=sid, tool=t)
    return tuple(dict.fromkeys(raw))


def _item(raw: Any, index: int, allowed: Sequence[str] = ()) -> PlannedSubtask:
    if not isinstance(raw, dict):
        raise PlanInvalid("wrong_shape", f"subtasks[{index}] is not an object", index=index)
    sid, desc = raw.get("id"), raw.get("description")
    deps, hint = raw.get("depends_on", []), raw.get("model_hint")
    if not isinstance(sid, str) or not ID_PATTERN.fullmatch(sid):
        raise PlanInvalid("bad_id", f"subtasks[{index}].id {sid!r} is not a valid id",
                          index=index)
    if not isinstance(desc, str) or not desc.strip():
        raise PlanInvalid("wrong_shape", f"subtask {sid!r} has no description", id=sid)
    if deps is None:
        deps = []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise PlanInvalid("wrong_shape", f"subtask {sid!r}: depends_on must be a list of ids",
                          id=sid)
    if hint is not None and not isinstance(hint, str):
        hint = None
    # JSON escapes can spell what no database stores (\u0000, lone surrogates): the
    # description becomes a prompt, dependencies may be echoed in an error
    deps = [storable(d)[0] for d in deps]
    return PlannedSubtask(sid, storable(desc.strip())[0], tuple(dict.fromkeys(deps)),
                          None if hint is None else storable(hint)[0],
                          _tools(raw.get("tools"), sid, allowed))


_FENCE = re.compile(r"\A\s*```[A-Za-z0-9_-]*[ \t]*\n(.*)\n[ \t]*```\s*\Z", re.DOTALL)


def _unfenced(content: str) -> str:
    """The JSON inside a Markdown code fence (```json ... ```), which models write even when
    asked for a JSON object; anything else as it is."""
    match = _FENCE.match(content)
    return match.group(1) if match else content


def parse_plan(content: str, finish_reason: str, max_subtasks: int,
               max_depth: int, tools: Sequence[str] = ()) -> list[PlannedSubtask]:
    """The plan in `content`, or PlanInvalid naming exactly what is wrong."""
    if finish_reason == "length":
        raise PlanInvalid("truncated", "the plan was cut off (finish_reason: length)")
    try:
        doc = json.loads(_unfenced(content))
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to decode
        reason = exc.args[0] if isinstance(exc, ValueError) else "nested too deeply"
        raise PlanInvalid("not_json", f"the answer is not JSON ({reason})") from exc
    items = doc.get("subtasks") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise PlanInvalid("wrong_shape", 'expected an object with a "subtasks" list')
    if not items:
        raise PlanInvalid("empty", "the plan has no subtasks")
    if len(items) > max_subtasks:
        raise PlanInvalid("too_many", f"{len(items)} subtasks; at most {max_subtasks} allowed",
                          count=len(items), limit=max_subtasks)
    plan = [_item(raw, i, tools) for i, raw in enumerate(items)]
    seen: set[str] = set()
    for p in plan:
        if p.id in seen:
            raise PlanInvalid("duplicate_id", f"id {p.id!r} is used twice", id=p.id)
        seen.add(p.id)
    deps = {p.id: list(p.depends_on) for p in plan}
    try:
        dag.validate_dag(deps, field="subtasks")
    except dag.DagError as exc:
        reason = "cycle" if exc.code == "dependency_cycle" else "unknown_dependency"
        raise PlanInvalid(reason, str(exc), **{k: v for k, v in exc.details.items()
                                               if k != "field"}) from exc
    depth = dag.depth(deps)
    if depth > max_depth:
        raise PlanInvalid("too_deep", f"dependency chain of {depth} subtasks; at most "
                          f"{max_depth} allowed", depth=depth, limit=max_depth)
    return plan


def worker_system_prompt(task: str) -> str:
    return ("You are a sub-agent in a team working on this overall task:\n"
            f"{task}\n\nDo only your own part, thoroughly and concretely.")
