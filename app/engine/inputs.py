"""What a subtask is sent: its prompt and its inputs (dependency outputs, or every worker's
result for the synthesizer) fitted to its model's window, oversized ones compressed by a
compressor subtask."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from app.db.tables import Subtask
from app.db.types import utcnow
from app.engine import planner as plans
from app.engine.context import (
    approx_tokens,
    fair_shares,
    fit_chars,
    room_tokens,
    truncate_marked,
    with_dependencies,
)
from app.engine.owned_swarm import Outcome, OwnedSwarm
from app.engine.subtask_rows import COMPRESSOR_PREFIX, new_subtask
from app.engine.synthesis import SYNTHESIZER_SYSTEM, WorkerResult, synthesis_prompt
from app.states import SubtaskKind, SubtaskStatus

COMPRESSOR_SYSTEM = ("You compress the result of another agent. Keep every fact, number, name, "
                     "decision and open question; drop repetition and filler.")
CONTEXT_MARGIN_TOKENS = 256
# how a compressor's call is made: the executor's one gateway call (slots, meter, result),
# handed to each `gather`, never kept (the executor holds this object: no cycle through it)
Call = Callable[[Subtask, list[dict[str, str]]], Awaitable[Outcome]]


@dataclass(frozen=True, slots=True)
class Input:
    """One result fed to a subtask, possibly replaced by its compressor's output (a worker's
    weight and truncation, for the synthesizer's prompt)."""

    name: str
    text: str
    compressed: bool = False
    weight: float = 1.0
    truncated: bool = False

    @classmethod
    def of(cls, result: WorkerResult) -> Input:
        return cls(result.name, result.output, weight=result.weight, truncated=result.truncated)

    @property
    def label(self) -> str:
        return f"{self.name} (compressed)" if self.compressed else self.name


class SubtaskInputs:
    """A swarm's subtasks' messages and inputs; one compressor per input, shared by every
    dependent that needs it."""

    def __init__(self, owned: OwnedSwarm) -> None:
        self.owned = owned
        self._compressions: dict[str, asyncio.Task[str | None]] = {}

    def messages(self, sub: Subtask, inputs: list[Input]) -> list[dict[str, str]]:
        room = fit_chars(self.room_tokens(sub))
        if sub.kind == SubtaskKind.synthesizer:
            fitted = [WorkerResult(i.label, i.text, i.weight, i.truncated) for i in inputs]
            subs = self.owned.subs
            missing = [n for n in self.owned.worker_names()
                       if subs[n].status != SubtaskStatus.succeeded]
            user = synthesis_prompt(self.owned.swarm.task, fitted, missing, room)
            system = sub.system_prompt or SYNTHESIZER_SYSTEM
        else:
            user = with_dependencies(self.prompt(sub), [(i.label, i.text) for i in inputs],
                                     room)
            system = self.system(sub)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": user})
        return messages

    def prompt(self, sub: Subtask) -> str:
        """The subtask's own prompt, or the task (stored once, on the swarm)."""
        return self.owned.swarm.task if sub.prompt is None else sub.prompt

    def system(self, sub: Subtask) -> str:
        """The subtask's system prompt; a planned worker's (None) is built from the task."""
        if sub.system_prompt is not None:
            return sub.system_prompt
        if sub.kind == SubtaskKind.worker:
            return plans.worker_system_prompt(self.owned.swarm.task)
        return ""

    def room_tokens(self, sub: Subtask) -> int:
        return room_tokens(self.owned.ctx.prices[sub.model].context_window, sub.max_tokens,
                           self.system(sub), self.prompt(sub), CONTEXT_MARGIN_TOKENS)

    async def gather(self, sub: Subtask, call: Call) -> list[Input]:
        """Dependency outputs (or, for the synthesizer, every result) fitted to the window:
        oversized ones compressed by a compressor subtask unless `compress` is `never`."""
        if sub.kind == SubtaskKind.synthesizer:
            given = [Input.of(r) for r in self.owned.worker_results()]
        elif sub.kind == SubtaskKind.worker:
            given = [Input(d, self.owned.subs[d].output or "") for d in self.owned.deps[sub.name]]
        else:
            return []
        if self.uncompressed(sub, given):
            return given
        mode = self.owned.spec["synthesis"].get("compress", "auto")
        sizes = [approx_tokens(i.text) for i in given]
        room = self.room_tokens(sub)
        shares = fair_shares(sizes, room)
        targets = [k for k in range(len(given)) if mode == "always" or sizes[k] > shares[k]]
        outputs = await asyncio.gather(*(
            self._compressed(given[k].name, given[k].text, max(min(shares[k], sizes[k]), 16),
                             call)
            for k in targets))
        for k, out in zip(targets, outputs, strict=True):
            if out is not None:
                given[k] = replace(given[k], text=out, compressed=True)
        return given

    def uncompressed(self, sub: Subtask, given: list[Input]) -> bool:
        """Whether the inputs go as they are (they fit the window, or `compress` says so)."""
        mode = self.owned.spec["synthesis"].get("compress", "auto")
        if not given or mode == "never":
            return True
        sizes = sum(approx_tokens(i.text) for i in given)
        return mode == "auto" and sizes <= self.room_tokens(sub)

    def _compressed(self, name: str, text: str, target: int,
                    call: Call) -> asyncio.Task[str | None]:
        """One compressor per input, shared by every dependent that needs it."""
        task = self._compressions.get(name)
        if task is None:
            task = asyncio.ensure_future(self._compress(name, text, target, call))
            self._compressions[name] = task
        return task

    async def _compress(self, name: str, text: str, target: int, call: Call) -> str | None:
        cname = f"{COMPRESSOR_PREFIX}{name}"
        sub = self.owned.subs.get(cname)
        if sub is None:
            cheapest = self.owned.ctx.prices.cheapest()
            # its own input fits its window beside its output: cut (visibly) past that
            target = min(target, cheapest.context_window // 2)
            head = f"Compress the result of agent {name!r} to at most {target} tokens:\n\n"
            room = (cheapest.context_window - target - approx_tokens(COMPRESSOR_SYSTEM)
                    - approx_tokens(head) - CONTEXT_MARGIN_TOKENS)
            sub = new_subtask(
                self.owned.swarm.id, cname, len(self.owned.subs), SubtaskKind.compressor,
                cheapest.name, target, depends_on=[name], system_prompt=COMPRESSOR_SYSTEM,
                prompt=head + truncate_marked(text, fit_chars(room)))
            self.owned.add_subtasks([sub])
            await self.owned.journal.commit(new=[sub])
        if sub.status == SubtaskStatus.pending:
            sub.ready_at = utcnow()
            await call(sub, [{"role": "system", "content": self.system(sub)},
                             {"role": "user", "content": self.prompt(sub)}])
        return sub.output if sub.status == SubtaskStatus.succeeded else None
