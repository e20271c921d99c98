"""From a validated request to the rows of a swarm: the checks that need settings or prices,
defaults resolved, and the system subtasks (synthesizer) added."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from app.config import Settings
from app.db.live_rows import new_live_swarm
from app.db.tables import Subtask, Swarm
from app.db.types import utcnow
from app.engine.dag import DagError, validate_dag
from app.engine.outputs import SchemaInvalid, check_schema
from app.engine.planner import planner_max_tokens
from app.engine.subtask_rows import PLANNER, new_subtask, synthesizer_for
from app.errors import Refused
from app.schemas import Limits, SwarmCreate, model_chain
from app.states import SubtaskKind, SwarmStatus
from app.tools.registry import ToolRegistry, ToolSelectionError, permitted


@dataclass(frozen=True, slots=True)
class NewSwarm:
    swarm: Swarm
    subtasks: list[Subtask]


FACADE_SOURCE = "openai.chat.completions"  # the `metadata.source` of a facade's swarm


def request_hash(body: SwarmCreate) -> str:
    """Stable hash of what the client asked for (for Idempotency-Key reuse checks)."""
    canon = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def check_model(settings: Settings, model: str | list[str], field: str) -> None:
    """Every model a field names is priced (a list: each of its items, named by index)."""
    listed = not isinstance(model, str)
    for i, name in enumerate(model_chain(model)):
        if name not in settings.prices:
            raise Refused(
                f"model {name!r} has no price; priced models: "
                f"{', '.join(settings.prices.names())}", code="unknown_model",
                details={"field": f"{field}.{i}" if listed else field, "model": name})


def check_models(settings: Settings, spec: dict[str, Any]) -> None:
    """The swarm's own models (its default, the synthesis's, the orchestrator's) are priced."""
    check_model(settings, spec["model"], "model")
    check_model(settings, spec["synthesis"]["model"], "synthesis.model")
    check_model(settings, spec["orchestrator"]["model"], "orchestrator.model")


def _check_agents(body: SwarmCreate, settings: Settings) -> None:
    agents = body.agents or []
    if len(agents) > settings.max_agents:
        raise Refused(
            f"{len(agents)} agents; at most {settings.max_agents} are allowed",
            code="too_many_agents",
            details={"field": "agents", "limit": settings.max_agents, "count": len(agents)})
    seen: dict[str, int] = {}
    for i, a in enumerate(agents):
        if a.name in seen:
            raise Refused(
                f"agent name {a.name!r} is used twice (agents.{seen[a.name]} and agents.{i})",
                code="duplicate_agent_name", details={"field": f"agents.{i}.name",
                                                      "name": a.name})
        seen[a.name] = i
        if a.model is not None:
            check_model(settings, a.model, f"agents.{i}.model")
    try:
        validate_dag({a.name: a.depends_on for a in agents})
    except DagError as exc:
        # name the field as everywhere else (agents.<index>.depends_on), not by agent name
        details = dict(exc.details)
        cycle = details.get("cycle")
        culprit = details.get("name") or (cycle[0] if isinstance(cycle, list) else None)
        if isinstance(culprit, str) and culprit in seen:
            details["field"] = f"agents.{seen[culprit]}.depends_on"
        raise Refused(str(exc), code=exc.code, details=details) from exc


def _check_schemas(body: SwarmCreate) -> None:
    """Every `output_schema` is a usable JSON Schema (SPEC §15); the synthesis one only where
    an LLM writes the result."""
    given = [(f"agents.{i}.output_schema", a.output_schema)
             for i, a in enumerate(body.agents or []) if a.output_schema is not None]
    synthesis = body.synthesis.output_schema
    if synthesis is not None:
        given.append(("synthesis.output_schema", synthesis))
        if body.synthesis.strategy != "synthesize":
            raise Refused("synthesis.output_schema needs strategy 'synthesize' (no LLM writes "
                          f"a {body.synthesis.strategy!r} result)", code="invalid_schema",
                          details={"field": "synthesis.output_schema"})
    for field, schema in given:
        try:
            check_schema(schema)
        except SchemaInvalid as exc:
            raise Refused(f"{field} {exc}", code="invalid_schema",
                          details={"field": field}) from exc


def _selectors(top: list[str] | None, agents: list[list[str] | None]) -> list[tuple[str, str]]:
    """(field, selector) of every tool a request names: its `tools`, then each agent's."""
    given = [(f"tools.{j}", sel) for j, sel in enumerate(top or [])]
    for i, own in enumerate(agents):
        given += [(f"agents.{i}.tools.{j}", sel) for j, sel in enumerate(own or [])]
    return given


def _check_permitted(given: list[tuple[str, str]], allowed: list[str] | None) -> None:
    """The tenant's `tools` (SPEC §8) list each selector; another is unknown to it."""
    for field, selector in given:
        if not permitted(selector, allowed):
            raise Refused(f"no tool {selector!r} for this tenant", code="unknown_tool",
                          details={"field": field, "tool": selector})


def check_tenant_tools(spec: dict[str, Any], allowed: list[str] | None) -> None:
    """A stored swarm's tools against the tenant's `tools` now (a retry runs them again)."""
    agents = spec.get("agents") or []
    _check_permitted(_selectors(spec.get("tools"), [a.get("tools") for a in agents]), allowed)


def _check_tools(body: SwarmCreate, tools: ToolRegistry | None,
                 allowed: list[str] | None) -> None:
    """Every tool selector is the tenant's to use and names a configured server that is up
    or restarting (and a tool it lists)."""
    given = _selectors(body.tools, [a.tools for a in body.agents or []])
    _check_permitted(given, allowed)  # first: what is not the tenant's says nothing of state
    for field, selector in given:
        if tools is None:
            raise Refused("no tool servers are configured (SWARM_MCP_CONFIG)",
                          code="unknown_tool", details={"field": field, "tool": selector})
        try:
            tools.check(selector)
        except ToolSelectionError as exc:
            raise Refused(str(exc), code=exc.code,
                          details={"field": field, "tool": selector}) from exc


def normalise(body: SwarmCreate, settings: Settings) -> dict[str, Any]:
    """The request with every default resolved: what the swarm will run with."""
    spec = body.model_dump(mode="json")
    model = body.model or settings.default_model
    spec["model"] = model
    spec["synthesis"]["model"] = body.synthesis.model or model
    spec["synthesis"]["max_tokens"] = body.synthesis.max_tokens or body.max_tokens
    spec["orchestrator"]["model"] = body.orchestrator.model or model
    if body.limits.budget_usd is not None:
        spec["limits"]["budget_usd"] = str(body.limits.budget_usd)
    return spec


def build_swarm(body: SwarmCreate, settings: Settings, tenant: str,
                idempotency_key: str | None = None, *,
                tools: ToolRegistry | None = None) -> NewSwarm:
    """Validate what the schema cannot and lay out the swarm's rows (not yet inserted).

    With `agents`, they are the workers; without, a planner subtask decomposes the task when
    the swarm runs (its workers and synthesizer are added then)."""
    spec = normalise(body, settings)
    check_models(settings, spec)
    _check_agents(body, settings)
    _check_schemas(body)
    _check_tools(body, tools, settings.tenant_limits(tenant).tools)
    swarm_id = str(uuid.uuid4())
    # the task is stored once, in its own column: not in the spec, and a prompt that is the
    # task is NULL (resolved when the call is made)
    del spec["task"]
    if body.agents is None:
        subtasks: list[Subtask] = [new_subtask(
            swarm_id, PLANNER, 0, SubtaskKind.planner, spec["orchestrator"]["model"],
            planner_max_tokens(body.orchestrator.max_subtasks),
            system_prompt=body.orchestrator.system_prompt, temperature=body.temperature)]
    else:
        subtasks = [
            new_subtask(
                swarm_id, a.name, i, SubtaskKind.worker, a.model or spec["model"],
                a.max_tokens or body.max_tokens, depends_on=list(a.depends_on),
                system_prompt=a.system_prompt, prompt=a.prompt,
                temperature=a.temperature if a.temperature is not None else body.temperature,
                weight=a.weight, tools=list(a.tools or []), max_turns=a.max_turns)
            for i, a in enumerate(body.agents)
        ]
        synth = synthesizer_for(swarm_id, spec, len(subtasks), [a.name for a in body.agents])
        if synth is not None:
            subtasks.append(synth)
    # a facade swarm keeps its body's hash too: an SDK's retry of the request finds it by that
    keep_hash = idempotency_key is not None or body.metadata.get("source") == FACADE_SOURCE
    swarm = new_swarm_row(swarm_id, tenant, body.task, spec, body.metadata,
                          body.limits.budget_usd, idempotency_key,
                          request_hash(body) if keep_hash else None)
    return NewSwarm(swarm, subtasks)


def new_swarm_row(swarm_id: str, tenant: str, task: str, spec: dict[str, Any],
                  meta: dict[str, Any], budget_usd: Decimal | None, idempotency_key: str | None,
                  digest: str | None, retry_of: str | None = None) -> Swarm:
    """A queued swarm with zeroed totals (not yet inserted), every column filled."""
    return new_live_swarm(
        id=swarm_id, tenant=tenant, status=SwarmStatus.queued, task=task, spec=spec,
        meta=meta, idempotency_key=idempotency_key, request_hash=digest,
        budget_usd=budget_usd, created_at=utcnow(), prompt_tokens=0,
        spent_usd=Decimal(0), reserved_usd=Decimal(0), unresolved_usd=Decimal(0),
        completion_tokens=0, gateway_calls=0, lease_epoch=0, rescues=0,
        cancel_requested=False, event_seq=0, retry_of=retry_of, result=None, error=None,
        started_at=None, finished_at=None, lease_owner=None, lease_expires_at=None,
        trace_parent=None, vote=None, erased_at=None, settled_epoch=0, takeovers=None,
        approval=None, approval_due_at=None,
    )


def retry_digest(swarm_id: str, limits: dict[str, Any]) -> str:
    """Stable hash of a retry request (for Idempotency-Key reuse checks)."""
    canon = json.dumps({"retry_of": swarm_id, "limits": limits}, sort_keys=True,
                       separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def retry_row(old: Swarm, limits: dict[str, Any], settings: Settings,
              idempotency_key: str | None, digest: str | None) -> Swarm:
    """The new swarm of a retry: the old request with `limits` (already validated, as JSON)
    over its limits; its subtasks are copied from the old swarm's rows."""
    merged = Limits.model_validate({**old.spec["limits"], **limits})
    spec = {**old.spec, "limits": {**old.spec["limits"], **limits}}
    check_models(settings, spec)
    return new_swarm_row(str(uuid.uuid4()), old.tenant, old.task, spec, old.meta,
                         merged.budget_usd, idempotency_key, digest, retry_of=old.id)
