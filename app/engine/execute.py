"""Running one subtask: slots, the gateway call, planning with one repair, input compression."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace

from app import tracing
from app.db.create import Ahead
from app.db.tables import Subtask
from app.db.types import utcnow
from app.engine import planner as plans
from app.engine.calls import CallMeter
from app.engine.context import (
    approx_tokens,
    fair_shares,
    fit_chars,
    room_tokens,
    truncate_marked,
    with_dependencies,
)
from app.engine.faults import crash_point
from app.engine.handle import LedgerRow, Outcome, SwarmHandle, failure
from app.engine.layout import COMPRESSOR_PREFIX, PLANNER, new_subtask, synthesizer_for
from app.engine.repair import OutputLadder
from app.engine.steps import CALL_FAILURES, SubtaskSteps
from app.engine.synthesis import SYNTHESIZER_SYSTEM, WorkerResult, synthesis_prompt
from app.engine.tenancy import TenantDailyCap
from app.engine.turns import TurnLoop
from app.engine.writer import WriteRejected
from app.states import SubtaskKind, SubtaskStatus

COMPRESSOR_SYSTEM = ("You compress the result of another agent. Keep every fact, number, name, "
                     "decision and open question; drop repetition and filler.")
CONTEXT_MARGIN_TOKENS = 256


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


@dataclass(frozen=True, slots=True)
class Prepared:
    """The synthesizer's call as prepared on the workers' answers: the results it was built
    on, its messages, and its meter, whose first attempt is written ahead."""

    results: list[WorkerResult]
    messages: list[dict[str, str]]
    meter: CallMeter


class SubtaskExecutor:
    """Executes the subtasks of one swarm: planner, workers, compressors, synthesizer."""

    def __init__(self, handle: SwarmHandle) -> None:
        self.handle = handle
        self.steps = SubtaskSteps(handle)
        self._compressions: dict[str, asyncio.Task[str | None]] = {}
        self.turns = TurnLoop(handle, self.steps)
        self.outputs = OutputLadder(handle, self.steps)
        self._prepared: asyncio.Task[Prepared | None] | None = None
        # workers whose first attempt's row was written with the swarm's creation
        self._first: dict[str, tuple[list[dict[str, str]], CallMeter]] = {}

    async def run(self, sub: Subtask) -> Outcome:
        """Never raises but for cancellation and a lost lease."""
        with tracing.agent_span(sub.name, sub.kind, sub.model, self.handle.swarm.id):
            outcome = await self._run(sub)
            if sub.status == SubtaskStatus.failed and sub.error:
                tracing.record_error(str(sub.error.get("code")), sub.error.get("message"))
            return outcome

    async def _run(self, sub: Subtask) -> Outcome:
        if sub.kind == SubtaskKind.planner:
            async with self.steps.slots(sub):
                return await self._plan(sub)
        if (first := self._first.pop(sub.name, None)) is not None:
            messages, meter = first
            return await self._call(sub, messages, written=meter)
        call_no = 1
        if sub.kind == SubtaskKind.synthesizer and self._prepared is not None:
            prepared = await self._take_prepared()
            if prepared is not None:
                return await self._call(sub, prepared.messages, prepared.meter)
            call_no = 2  # its call 1 was written ahead and cancelled: that row keeps its key
        inputs = await self._inputs(sub)  # compressors take their own slots (in _call)
        if sub.tools:  # the turn loop takes a slot per turn, never while tools run
            return await self.turns.run(sub, self._messages(sub, inputs))
        return await self._call(sub, self._messages(sub, inputs), call_no=call_no)

    # ---- the first wave written with the swarm's creation -------------------------------

    def first_wave(self) -> Ahead:
        """The first attempts of the workers a new swarm sends first (no dependency, no
        tools; in launch order, as many as its concurrency), opened now for the creation's
        statement to write: their calls are then sent as soon as the swarm starts, with no
        write-ahead commit of their own (a 100-agent fan-out's first sends waited ~7 ms for
        it; a 1-agent swarm made two commits where one is left, bench/RESULTS.md session
        28). The tenant's daily cap, when it has one, is asked in that statement too. Until
        it is sent, each is released like any row written ahead; if the creation fails,
        nothing was written. None behind the process-wide daily cap (a statement of its
        own), nor with the latency devices off, nor past what the swarm's budget holds now."""
        handle = self.handle
        cap = handle.ctx.cap_for(handle.swarm.tenant)
        if (not handle.ctx.settings.latency_devices or PLANNER in handle.subs
                or (cap is not None and not isinstance(cap, TenantDailyCap))):
            return Ahead([])
        rows: list[LedgerRow] = []
        ready = sorted((s for s in handle.subs.values() if s.kind == SubtaskKind.worker
                        and s.status == SubtaskStatus.pending and not s.depends_on
                        and not s.tools), key=lambda s: s.position)
        for sub in ready[:int(handle.limits["concurrency"])]:
            messages = self._messages(sub, [])
            meter = self.steps.meter(sub, messages, 1)
            row = meter.reserve_ahead(cap_asked=cap is not None)
            if row is None:
                break
            rows.append(row)
            self._first[sub.name] = (messages, meter)
            # counted once the swarm runs (`first_wave_opened`): the creation's answer and its
            # row say, as for any subtask not started, that no attempt was made yet
            sub.attempts -= 1
        return Ahead(rows, cap.ask(rows) if cap is not None and rows else None)

    def first_wave_opened(self, ahead: Ahead | None) -> None:
        """The swarm runs, its creation stored: its first wave's attempts count, each with
        its reservation against the tenant's cap; one the cap refused was never written, and
        is prepared again at its turn."""
        checks = ahead.checks if ahead is not None else None
        cap = self.handle.ctx.cap_for(self.handle.swarm.tenant)
        for k, (name, (_, meter)) in enumerate(list(self._first.items())):
            if checks is not None:
                check = checks[k]
                if check.reservation_id is None:
                    meter.withdraw_ahead()
                    del self._first[name]
                    continue
                assert isinstance(cap, TenantDailyCap)
                meter.hold_daily(cap.held(check.reservation_id, check.day, meter.worst))
            meter.sub.attempts += 1

    # ---- the synthesizer prepared on the workers' answers --------------------------------

    def prepare(self, synth: Subtask) -> None:
        """The last worker's answer is in, its result about to be queued for its commit: build
        the synthesizer's call on the answers and queue its first attempt's row now, so that it
        commits with the last results (one commit on the swarm's critical path where there
        were two, bench/RESULTS.md session 24) — or, when a shared cap must be asked first,
        write it ahead while they commit. The call is still sent only from `_run`, once every
        worker's result is durable, and only if what they stored is what it was built on.
        (No `ahead_slots` permit: no call is waiting for its slots any more.)"""
        if (self._prepared is not None or synth.tools
                or not self.handle.ctx.settings.latency_devices):
            return
        results = self.handle.worker_results()
        inputs = [Input.of(r) for r in results]
        try:
            if not results or not self._uncompressed(synth, inputs):  # compressors: at its turn
                return
            messages = self._messages(synth, inputs)
            prepared = Prepared(results, messages, self.steps.meter(synth, messages, 1))
        except ValueError:
            # the answers are not stored yet: one the database will refuse may hold text
            # that does not even encode (the gateway client cleans it, unless switched off);
            # the synthesizer then waits for its turn, and this worker's result is unharmed
            return
        written = prepared.meter.prepare_now()
        self._prepared = asyncio.create_task(
            self._prepare(prepared) if written is None else self._durable(prepared, written))

    @staticmethod
    async def _durable(prepared: Prepared, written: asyncio.Future[None]) -> Prepared | None:
        try:
            await written
        except BaseException as exc:
            await prepared.meter.release()  # cancelled: never sent
            if isinstance(exc, WriteRejected):
                return None  # its turn writes it again, alone
            raise
        return prepared

    @staticmethod
    async def _prepare(prepared: Prepared) -> Prepared | None:
        """A shared cap to reserve against (every tenant's daily one by default) or a budget
        to wait for: the row is written ahead as any call's, while the results commit."""
        try:
            await prepared.meter.prepare()  # cleans up after itself when it fails
        except CALL_FAILURES:  # the budget, say: its turn meets the same refusal
            return None
        return prepared

    async def _take_prepared(self) -> Prepared | None:
        """The prepared call, if it is still the one to make: a result it was built on may
        have been refused by the database since (that worker failed), and its attempt is then
        cancelled, never sent."""
        task, self._prepared = self._prepared, None
        assert task is not None
        prepared = await task
        if prepared is None or prepared.results == self.handle.worker_results():
            return prepared
        await prepared.meter.release()
        return None

    async def discard_prepared(self) -> None:
        """The synthesizer is not called (the swarm stops): a prepared attempt is cancelled,
        as is a first attempt written with the creation whose worker was never started."""
        first, self._first = self._first, {}
        for _, meter in first.values():
            await meter.release()
        task, self._prepared = self._prepared, None
        if task is None:
            return
        task.cancel()  # one still writing ahead cleans up after itself
        done = await asyncio.gather(task, return_exceptions=True)
        if isinstance(done[0], Prepared):
            await done[0].meter.release()

    # ---- one gateway call ---------------------------------------------------------------

    async def _call(self, sub: Subtask, messages: list[dict[str, str]],
                    prepared: CallMeter | None = None, call_no: int = 1,
                    written: CallMeter | None = None) -> Outcome:
        steps = self.steps
        # The slots count gateway calls in flight: the first attempt's ledger row is written
        # ahead before they are taken, they are given back once the answer is in, and the
        # result's commit is awaited outside them (under load a group commit takes tens of
        # milliseconds: inside, each idled the slot that long per subtask). A row `written`
        # with the creation waits for its slots as one written ahead here would.
        meter = prepared or written or steps.meter(sub, messages, call_no)
        try:
            async with steps.slots(sub, ahead=None if prepared else meter):
                if self.handle.stopping:  # stopped while it waited: never sent (no cost)
                    return Outcome.swarm_stopping
                t0 = steps.begin(sub)
                crash_point("before_call", sub.name)
                try:
                    result, rows = await steps.gateway(sub, messages, 1, meter=meter)
                except CALL_FAILURES as exc:
                    failed: Exception | None = exc
                    if not self.outputs.refused(sub, exc):  # else asked again (json_object)
                        steps.failing(sub, exc)  # before the slot is given back
                else:
                    failed = None
        except CALL_FAILURES as exc:  # its write-ahead failed: it starts only to fail
            return await steps.call_failed(sub, steps.begin(sub), exc)
        finally:
            await meter.release()  # written ahead but never sent (cancelled): no cost
        if failed is not None and not self.outputs.refused(sub, failed):
            return await steps.call_failed(sub, t0, failed)
        crash_point("after_response", sub.name)
        if self.outputs.schema(sub) is not None:  # parsed, validated, repaired (SPEC §15)
            return await self.outputs.settle(sub, t0, messages,
                                             None if failed else result, [] if failed else rows)
        sub.truncated = result.finish_reason == "length"
        sub.sanitized = result.sanitized
        return await steps.succeed(sub, t0, result.content, rows)

    # ---- planning ----------------------------------------------------------------------

    async def _plan(self, sub: Subtask) -> Outcome:
        """The orchestrator call; an invalid or truncated plan gets exactly one repair call."""
        spec = self.handle.spec
        limits = spec["orchestrator"]
        offered = spec.get("tools") or []
        first = plans.planner_messages(self.handle.swarm.task, limits["max_subtasks"],
                                       limits["max_depth"], self.handle.ctx.prices.names(),
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
                self.handle.commit_soon([sub], ledger=rows)  # the first call is billed either way
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
                self.handle.commit_soon([sub], ledger=rows)
            return await self.steps.call_failed(sub, t0, exc)
        sub.sanitized = result.sanitized
        new = self._lay_out(plan)
        output = json.dumps({"subtasks": [
            {"id": p.id, "description": p.description, "depends_on": list(p.depends_on),
             "model_hint": p.model_hint, "tools": list(p.tools)} for p in plan]})
        return await self.steps.succeed(sub, t0, output, rows, new)

    def _lay_out(self, plan: list[plans.PlannedSubtask]) -> list[Subtask]:
        """Worker subtasks for the plan (hinted models only when priced) and the synthesizer."""
        spec, swarm_id = self.handle.spec, self.handle.swarm.id
        base = len(self.handle.subs)
        prices = self.handle.ctx.prices
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
        self.handle.add_subtasks(subs)
        return subs

    # ---- inputs and compression --------------------------------------------------------

    def _messages(self, sub: Subtask, inputs: list[Input]) -> list[dict[str, str]]:
        room = fit_chars(self._room_tokens(sub))
        if sub.kind == SubtaskKind.synthesizer:
            fitted = [WorkerResult(i.label, i.text, i.weight, i.truncated) for i in inputs]
            subs = self.handle.subs
            missing = [n for n in self.handle.worker_names()
                       if subs[n].status != SubtaskStatus.succeeded]
            user = synthesis_prompt(self.handle.swarm.task, fitted, missing, room)
            system = sub.system_prompt or SYNTHESIZER_SYSTEM
        else:
            user = with_dependencies(self._prompt(sub), [(i.label, i.text) for i in inputs],
                                     room)
            system = self._system(sub)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": user})
        return messages

    def _prompt(self, sub: Subtask) -> str:
        """The subtask's own prompt, or the task (stored once, on the swarm)."""
        return self.handle.swarm.task if sub.prompt is None else sub.prompt

    def _system(self, sub: Subtask) -> str:
        """The subtask's system prompt; a planned worker's (None) is built from the task."""
        if sub.system_prompt is not None:
            return sub.system_prompt
        if sub.kind == SubtaskKind.worker:
            return plans.worker_system_prompt(self.handle.swarm.task)
        return ""

    def _room_tokens(self, sub: Subtask) -> int:
        return room_tokens(self.handle.ctx.prices[sub.model].context_window, sub.max_tokens,
                           self._system(sub), self._prompt(sub), CONTEXT_MARGIN_TOKENS)

    async def _inputs(self, sub: Subtask) -> list[Input]:
        """Dependency outputs (or, for the synthesizer, every result) fitted to the window:
        oversized ones compressed by a compressor subtask unless `compress` is `never`."""
        if sub.kind == SubtaskKind.synthesizer:
            given = [Input.of(r) for r in self.handle.worker_results()]
        elif sub.kind == SubtaskKind.worker:
            given = [Input(d, self.handle.subs[d].output or "") for d in self.handle.deps[sub.name]]
        else:
            return []
        if self._uncompressed(sub, given):
            return given
        mode = self.handle.spec["synthesis"].get("compress", "auto")
        sizes = [approx_tokens(i.text) for i in given]
        room = self._room_tokens(sub)
        shares = fair_shares(sizes, room)
        targets = [k for k in range(len(given)) if mode == "always" or sizes[k] > shares[k]]
        outputs = await asyncio.gather(*(
            self._compressed(given[k].name, given[k].text, max(min(shares[k], sizes[k]), 16))
            for k in targets))
        for k, out in zip(targets, outputs, strict=True):
            if out is not None:
                given[k] = replace(given[k], text=out, compressed=True)
        return given

    def _uncompressed(self, sub: Subtask, given: list[Input]) -> bool:
        """Whether the inputs go as they are (they fit the window, or `compress` says so)."""
        mode = self.handle.spec["synthesis"].get("compress", "auto")
        if not given or mode == "never":
            return True
        sizes = sum(approx_tokens(i.text) for i in given)
        return mode == "auto" and sizes <= self._room_tokens(sub)

    def _compressed(self, name: str, text: str, target: int) -> asyncio.Task[str | None]:
        """One compressor per input, shared by every dependent that needs it."""
        task = self._compressions.get(name)
        if task is None:
            task = asyncio.ensure_future(self._compress(name, text, target))
            self._compressions[name] = task
        return task

    async def _compress(self, name: str, text: str, target: int) -> str | None:
        cname = f"{COMPRESSOR_PREFIX}{name}"
        sub = self.handle.subs.get(cname)
        if sub is None:
            cheapest = self.handle.ctx.prices.cheapest()
            # its own input fits its window beside its output: cut (visibly) past that
            target = min(target, cheapest.context_window // 2)
            head = f"Compress the result of agent {name!r} to at most {target} tokens:\n\n"
            room = (cheapest.context_window - target - approx_tokens(COMPRESSOR_SYSTEM)
                    - approx_tokens(head) - CONTEXT_MARGIN_TOKENS)
            sub = new_subtask(
                self.handle.swarm.id, cname, len(self.handle.subs), SubtaskKind.compressor,
                cheapest.name, target, depends_on=[name], system_prompt=COMPRESSOR_SYSTEM,
                prompt=head + truncate_marked(text, fit_chars(room)))
            self.handle.add_subtasks([sub])
            await self.handle.commit(new=[sub])
        if sub.status == SubtaskStatus.pending:
            sub.ready_at = utcnow()
            await self._call(sub, [{"role": "system", "content": self._system(sub)},
                                   {"role": "user", "content": self._prompt(sub)}])
        return sub.output if sub.status == SubtaskStatus.succeeded else None



def _routed_model(model: str | list[str], hint: str | None, priced: bool
                  ) -> str | list[str]:
    """A planned worker's model: the planner's priced hint, else the swarm's; a hint in front
    of the swarm's list keeps the list's models to fall back on."""
    if not hint or not priced:
        return model
    if isinstance(model, str):
        return hint
    return [hint, *(m for m in model if m != hint)]
