"""Running one subtask: its slots and its gateway call; the planner's run, its inputs and the
calls written ahead are modules of their own (planner_call, inputs, written_ahead)."""

from __future__ import annotations

from app import tracing
from app.db.create import Ahead
from app.db.tables import Subtask
from app.engine.calls import CallMeter
from app.engine.faults import crash_point
from app.engine.inputs import SubtaskInputs
from app.engine.lifecycle import CALL_FAILURES, SubtaskSteps
from app.engine.owned_swarm import Outcome, OwnedSwarm
from app.engine.planner_call import PlannerCall
from app.engine.repair import OutputLadder
from app.engine.turns import TurnLoop
from app.engine.written_ahead import WrittenAhead
from app.states import SubtaskKind, SubtaskStatus


class SubtaskExecutor:
    """Executes the subtasks of one swarm: planner, workers, compressors, synthesizer."""

    def __init__(self, owned: OwnedSwarm) -> None:
        self.owned = owned
        self.steps = SubtaskSteps(owned)
        self.turns = TurnLoop(owned, self.steps)
        self.outputs = OutputLadder(owned, self.steps)
        self.inputs = SubtaskInputs(owned)
        self.planner = PlannerCall(owned, self.steps)
        self.ahead = WrittenAhead(owned, self.steps, self.inputs)

    async def run(self, sub: Subtask) -> Outcome:
        """Never raises but for cancellation and a lost lease."""
        with tracing.agent_span(sub.name, sub.kind, sub.model, self.owned.swarm.id):
            outcome = await self._run(sub)
            if sub.status == SubtaskStatus.failed and sub.error:
                tracing.record_error(str(sub.error.get("code")), sub.error.get("message"))
            return outcome

    async def _run(self, sub: Subtask) -> Outcome:
        if sub.kind == SubtaskKind.planner:
            async with self.steps.slots(sub):
                return await self.planner.run(sub)
        if (first := self.ahead.first_of(sub.name)) is not None:
            if first.tools is not None:  # its first turn written with the creation
                return await self.turns.run(sub, first.messages, written=first.meter,
                                            tools=first.tools)
            return await self._call(sub, first.messages, written=first.meter)
        call_no = 1
        if sub.kind == SubtaskKind.synthesizer and self.ahead.preparing:
            prepared = await self.ahead.take_prepared()
            if prepared is not None:
                return await self._call(sub, prepared.messages, prepared.meter)
            call_no = 2  # its call 1 was written ahead and cancelled: that row keeps its key
        inputs = await self.inputs.gather(sub, self._call)  # compressors: own slots (_call)
        if sub.tools:  # the turn loop takes a slot per turn, never while tools run
            return await self.turns.run(sub, self.inputs.messages(sub, inputs))
        return await self._call(sub, self.inputs.messages(sub, inputs), call_no=call_no)

    # ---- the calls written ahead (written_ahead.py) --------------------------------------

    def first_wave(self) -> Ahead:
        """The first attempts a new swarm's creation writes (`WrittenAhead.first_wave`)."""
        return self.ahead.first_wave()

    def first_wave_opened(self, ahead: Ahead | None) -> None:
        """The swarm runs, its creation stored (`WrittenAhead.first_wave_opened`)."""
        self.ahead.first_wave_opened(ahead)

    def prepare(self, synth: Subtask) -> None:
        """The synthesizer's call built on the answers (`WrittenAhead.prepare`)."""
        self.ahead.prepare(synth)

    async def discard_prepared(self) -> None:
        """The synthesizer is not called (`WrittenAhead.discard`)."""
        await self.ahead.discard()

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
                if self.owned.stopping:  # stopped while it waited: never sent (no cost)
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
