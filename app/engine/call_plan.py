"""The calls a swarm's subtasks would make, as `estimate` reads them: each call's messages
built as the engine builds them (other agents' outputs left out, and the room they are fitted
into), and the agents as a request posts them. Pure: no IO."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from app.db.tables import Subtask
from app.engine.context import fit_chars, room_tokens, with_dependencies
from app.engine.estimate import Plan, PlannedCall
from app.engine.inputs import CONTEXT_MARGIN_TOKENS
from app.engine.outputs import schema_tokens, schemas_of
from app.engine.planner import PlannedSubtask, worker_system_prompt
from app.engine.subtask_rows import synthesizer
from app.engine.synthesis import SYNTHESIZER_SYSTEM, WorkerResult, synthesis_prompt
from app.pricing import PriceTable
from app.states import SubtaskKind

# an agent's tool selectors -> their definitions in the OpenAI `tools` format
ToolDefinitions = Callable[[Sequence[str]], list[dict[str, Any]]]


def _messages(system: str, user: str) -> list[dict[str, Any]]:
    return [*([{"role": "system", "content": system}] if system else []),
            {"role": "user", "content": user}]


def _worker(sub: Subtask, task: str, prices: PriceTable,
            tools: ToolDefinitions) -> PlannedCall:
    system = worker_system_prompt(task) if sub.system_prompt is None else sub.system_prompt
    prompt = task if sub.prompt is None else sub.prompt
    deps = tuple(sub.depends_on)
    room = 0
    if deps:  # the room its inputs are fitted into
        room = fit_chars(room_tokens(prices[sub.model].context_window, sub.max_tokens, system,
                                     prompt, CONTEXT_MARGIN_TOKENS))
    defs = tools(sub.tools) if sub.tools else []
    return PlannedCall(
        sub.name, SubtaskKind.worker, sub.model, sub.max_tokens,
        _messages(system, with_dependencies(prompt, [(d, "") for d in deps])),
        inputs=deps, room_chars=room, tools=defs, max_turns=sub.max_turns if defs else 1)


def _synthesizer(sub: Subtask, task: str, prices: PriceTable, maybe: bool = False
                 ) -> PlannedCall:
    workers = tuple(sub.depends_on)
    user = synthesis_prompt(task, [WorkerResult(n, "") for n in workers], [])
    own = sub.system_prompt or ""
    room = room_tokens(prices[sub.model].context_window, sub.max_tokens, own, task,
                       CONTEXT_MARGIN_TOKENS)
    return PlannedCall(sub.name, SubtaskKind.synthesizer, sub.model, sub.max_tokens,
                       _messages(own or SYNTHESIZER_SYSTEM, user), inputs=workers,
                       room_chars=fit_chars(room), maybe=maybe)


def plan_of(task: str, spec: dict[str, Any], subtasks: Sequence[Subtask],
            agents: list[dict[str, Any]], prices: PriceTable, tools: ToolDefinitions,
            tool_result_bytes: int) -> Plan:
    """The plan of a swarm laid out by `build_swarm` with its agents named."""
    calls: list[PlannedCall] = []
    deps: dict[str, list[str]] = {}
    for sub in subtasks:
        if sub.kind is SubtaskKind.worker:
            calls.append(_worker(sub, task, prices, tools))
            deps[sub.name] = list(sub.depends_on)
        elif sub.kind is SubtaskKind.synthesizer:
            calls.append(_synthesizer(sub, task, prices))
    if spec["synthesis"]["strategy"] == "vote" and deps:  # no two answers agree: synthesized
        swarm_id = subtasks[0].swarm_id
        calls.append(_synthesizer(synthesizer(swarm_id, spec, len(subtasks), list(deps)), task,
                                  prices, maybe=True))
    schemas = schemas_of(spec)
    for call in calls:  # an output schema travels as response_format: the engine bounds it
        if (schema := schemas.get(call.name)) is not None:
            call.schema_bound = schema_tokens(schema)
    return Plan(calls, agents, deps, int(spec["limits"]["concurrency"]), tool_result_bytes)


def planned_agents(plan: Sequence[PlannedSubtask], task: str, spec: dict[str, Any],
                   prices: PriceTable) -> list[dict[str, Any]]:
    """A planner's subtasks as `agents` of a request: posted, they run what the planned swarm
    would (a priced model hint under `routing: auto`, the planned workers' system prompt)."""
    routed = spec.get("orchestrator", {}).get("routing", "auto") == "auto"
    return [{"name": p.id, "prompt": p.description,
             "system_prompt": worker_system_prompt(task),
             "model": p.model_hint if routed and p.model_hint and p.model_hint in prices
             else spec["model"],
             "depends_on": list(p.depends_on), "tools": list(p.tools) or None}
            for p in plan]


def named_agents(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's agents as the spec holds them (every field, defaults filled), each model
    resolved: postable as they are. Read from the spec's dump (`normalise` made it), not
    serialised again."""
    model = spec["model"]  # a name, or the list to fall back on
    return [{**a, "model": a["model"] or model} for a in spec["agents"]]
