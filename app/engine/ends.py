"""A swarm's end: its final state committed with the result held for it, and, when that
commit is refused, the end it would have had without that result."""

from __future__ import annotations

from typing import Any

from app import metrics
from app.db.tables import Subtask
from app.db.types import utcnow
from app.engine.faults import crash_point
from app.engine.finish import end_swarm, log_end
from app.engine.lifecycle import refused_result, unstorable
from app.engine.owned_swarm import EventRow, failure
from app.engine.run_state import RunnerState
from app.engine.tolerance import FailureTolerance
from app.engine.writer import WriteRejected
from app.states import SubtaskKind, SwarmStatus, amend_end


class SwarmEnds:
    """The run's end commit and its refused variant, over its state; a refused last worker's
    result asks the failure tolerance."""

    def __init__(self, state: RunnerState, tolerance: FailureTolerance) -> None:
        self.state = state
        self.tolerance = tolerance
        self.finished = False  # the end is committed

    async def finish(self, status: SwarmStatus, err: dict[str, Any] | None) -> None:
        state, swarm, now = self.state, self.state.swarm, utcnow()
        end = end_swarm(swarm, state.subs.values(), status, err, now)
        held, held_ledger, held_events = state.journal.take_held()  # the last result
        changed, events = [*held, *end.changed], [*held_events, *end.events]
        notifier = state.ctx.notifier
        answer: list[bytes] = []

        def render() -> None:  # a waiting reader's answer, built while the end commits
            if notifier is not None and (
                    view := notifier.render(swarm.id, swarm, state.subs.values())):
                answer.append(view)

        try:
            await state.journal.commit(changed, held_ledger, events, webhook=end.webhook,
                                       meanwhile=render)
        except WriteRejected as exc:  # the result, say: end failed without it, not in a loop
            answer.clear()  # it showed the end refused
            status, err = self._refused_end(status, held, held_events, exc)
            completed = end.events[-1]
            completed["data"] = {**completed["data"], "status": status.value, "error": err}
            await state.journal.commit(changed, held_ledger, events, webhook=end.webhook,
                                       meanwhile=render)
        for sub in held:
            crash_point("after_commit", sub.name)
        self.finished = True
        if notifier is not None:  # committed: what a waiting reader may answer with
            notifier.ended(swarm.id, swarm, list(state.subs.values()),
                           answer[0] if answer else None)
        started = swarm.started_at or swarm.created_at
        duration = (now - started).total_seconds()
        metrics.runs_total.labels(status.value).inc()
        metrics.run_duration.labels(status.value).observe(duration)
        metrics.run_cost.labels(status.value).observe(float(state.budget.spent))
        log_end(swarm, status, duration, err)

    def _refused_end(self, status: SwarmStatus, held: list[Subtask], held_events: list[EventRow],
                     exc: WriteRejected) -> tuple[SwarmStatus, dict[str, Any] | None]:
        """The end's commit was refused (never stored): the swarm's end without what it held,
        as it would have been had that result been refused alone. A held result fails its
        subtask (`output_unstorable`): the synthesizer's fails the swarm; a last worker's
        fails the swarm only past the failure tolerance, its result combined without it."""
        state, swarm = self.state, self.state.swarm
        err: dict[str, Any] | None
        if held:
            err = unstorable(exc)
            for sub, row in zip(held, held_events, strict=True):
                refused_result(sub, row, err)
        else:
            err = failure("internal", f"the final state was refused: {exc}")
        if held and held[0].kind is SubtaskKind.worker:
            if status is SwarmStatus.succeeded and self.tolerance.past_tolerance():
                status, err = SwarmStatus.failed, state.stop_error
            else:
                err = swarm.error
            swarm.result = (state.combined(state.worker_results())
                            if status is SwarmStatus.succeeded else None)
        else:
            status, swarm.result = SwarmStatus.failed, None
        amend_end(swarm, status)  # the first was never committed
        swarm.error = err
        return status, err
