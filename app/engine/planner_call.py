"""The planner subtask's run: the orchestrator's call with exactly one repair, and the worker
subtasks and synthesizer laid out for its plan."""

from __future__ import annotations

import json

from app.db.tables import Subtask
from app.engine import planner as plans
from app.engine.lifecycle import CALL_FAILURES, SubtaskSteps
from app.engine.owned_swarm import LedgerRow, Outcome, OwnedSwarm, failure
from app.engine.subtask_rows import new_subtask, synthesizer_for
from app.states import SubtaskKind


class PlannerCall:
    """Runs a swarm's planner subtask (in its slots, which the executor holds)."""

    def __init__(self, owned: OwnedSwarm, steps: SubtaskSteps) -> None:
        self.owned = owned
        self.steps = steps

    async def run(self, sub: Subtask) -> Outcome:
        """The orchestrator call; an invalid or truncated plan gets exactly one repair call."""
        spec = self.owned.spec
        limits = spec["orchestrator"]
        offered = spec.get("tools") or []
        first = plans.planner_messages(self.owned.swarm.task, limits["max_subtasks"],
                                       limits["max_depth"], self.owned.ctx.prices.names(),
                                       sub.system_prompt or "", offered)
        t0 = self.steps.begin(sub)
        rows: list[LedgerRow] = []
        try:
            result, ok = await self.steps.gateway(sub, first, 1, plans.JSON_OBJECT)
            rows += ok
            try:
                plan = plans.parse_plan(result.content, result.finish_reason,
                                        limits["max_subtasks"], limits["max_depth"], offered)
            except plans.PlanInvalid as bad:
                # the first call is billed either way
                self.owned.journal.commit_soon([sub], ledger=rows)
                rows = []
                repair = plans.repair_messages(first, result.content, bad)
                result, ok = await self.steps.gateway(sub, repair, 2, plans.JSON_OBJECT)
                rows += ok
                plan = plans.parse_plan(result.content, result.finish_reason,
                                        limits["max_subtasks"], limits["max_depth"], offered)
        except plans.PlanInvalid as still:
            err = failure("plan_invalid", f"the plan is invalid after one repair: {still}",
                        **still.details)
            return await self.steps.fail(sub, t0, err, rows)
        except CALL_FAILURES as exc:
            if rows:
                self.owned.journal.commit_soon([sub], ledger=rows)
            return await self.steps.call_failed(sub, t0, exc)
        sub.sanitized = result.sanitized
        new = self.lay_out(plan)
        output = json.dumps({"subtasks": [
            {"id": p.id, "description": p.description, "depends_on": list(p.depends_on),
             "model_hint": p.model_hint, "tools": list(p.tools)} for p in plan]})
        return await self.steps.succeed(sub, t0, output, rows, new)

    def lay_out(self, plan: list[plans.PlannedSubtask]) -> list[Subtask]:
        """Worker subtasks for the plan (hinted models only when priced) and the synthesizer."""
        spec, swarm_id = self.owned.spec, self.owned.swarm.id
        base = len(self.owned.subs)
        prices = self.owned.ctx.prices
        routed = spec.get("orchestrator", {}).get("routing", "auto") == "auto"
        subs: list[Subtask] = [
            new_subtask(swarm_id, p.id, base + i, SubtaskKind.worker,
                        _routed_model(spec["model"], p.model_hint if routed else None,
                                      p.model_hint in prices),
                        spec["max_tokens"], depends_on=list(p.depends_on),
                        system_prompt=None,  # worker_system_prompt(task), when called
                        prompt=p.description, temperature=spec.get("temperature"),
                        tools=list(p.tools))
            for i, p in enumerate(plan)
        ]
        synth = synthesizer_for(swarm_id, spec, base + len(plan), [p.id for p in plan])
        if synth is not None:
            subs.append(synth)
        self.owned.add_subtasks(subs)
        return subs


def _routed_model(model: str | list[str], hint: str | None, priced: bool
                  ) -> str | list[str]:
    """A planned worker's model: the planner's priced hint, else the swarm's; a hint in front
    of the swarm's list keeps the list's models to fall back on."""
    if not hint or not priced:
        return model
    if isinstance(model, str):
        return hint
    return [hint, *(m for m in model if m != hint)]
