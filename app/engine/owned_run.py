"""The runner's `OwnedSwarm`: what the code running a swarm's subtasks sees of its run, composed
of the run's state and its failure tolerance. It holds both and neither holds it, so a swarm's
run stays free of reference cycles (tests/perf/test_runner_freed.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.db.tables import Subtask
from app.engine.journal import SwarmJournal
from app.engine.owned_swarm import EventRow
from app.engine.run_state import RunnerState
from app.engine.synthesis import WorkerResult
from app.engine.tolerance import FailureTolerance
from app.states import Event, SwarmStatus


class OwnedRun:
    """One swarm's run as its subtasks see it (an `OwnedSwarm`)."""

    def __init__(self, state: RunnerState, tolerance: FailureTolerance) -> None:
        self._state = state
        self._tolerance = tolerance
        # the state never rebinds these (it mutates them): the same objects as its own
        self.ctx = state.ctx
        self.swarm = state.swarm
        self.spec = state.spec
        self.limits = state.limits
        self.subs = state.subs
        self.deps = state.deps
        self.budget = state.budget
        self.call_slots = state.call_slots
        self.ahead_slots = state.ahead_slots

    @property
    def deadline(self) -> float:
        return self._state.deadline  # a takeover's start moves it

    @property
    def journal(self) -> SwarmJournal:
        return self._state.journal

    @property
    def stopping(self) -> bool:
        return self._state.stopping

    def event(self, event: Event) -> EventRow:
        return self._state.event(event)

    def stop_with(self, status: SwarmStatus, err: dict[str, Any] | None) -> None:
        self._state.stop_with(status, err)

    def deadline_error(self) -> dict[str, Any]:
        return self._state.deadline_error()

    def add_subtasks(self, subs: Sequence[Subtask]) -> None:
        self._state.add_subtasks(subs)

    def forget_subtasks(self, subs: Sequence[Subtask]) -> None:
        self._state.forget_subtasks(subs)

    def chain_below(self) -> dict[str, int]:
        return self._state.chain_below()

    def worker_names(self) -> list[str]:
        return self._state.worker_names()

    def worker_results(self) -> list[WorkerResult]:
        return self._state.worker_results()

    # ---- failure tolerance's bookkeeping of answers ------------------------------------

    def answered(self, sub: Subtask) -> None:
        self._tolerance.answered(sub)

    def last_answer(self, sub: Subtask) -> bool:
        return self._tolerance.last_answer(sub)

    def failing(self, name: str, error: dict[str, Any]) -> None:
        self._tolerance.failing(name, error)
