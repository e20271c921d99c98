"""A swarm's failure tolerance: which workers have answered, a failed worker's dependents
skipped, and the swarm stopped once its failed workers pass `limits.failure_tolerance`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.db.tables import Subtask
from app.db.types import utcnow
from app.engine import dag
from app.engine.owned_swarm import EventRow, failure, failure_causes
from app.engine.run_state import RunnerState
from app.states import SubtaskKind, SubtaskStatus, SwarmStatus, move_subtask


class FailureTolerance:
    """The run's bookkeeping of failed and answered workers, over its state; the phase loop
    and the subtasks (through OwnedRun) ask it."""

    def __init__(self, state: RunnerState) -> None:
        self.state = state
        # during the workers' phase: the workers yet to answer (None outside it), and what to
        # do once none is left (`answered`) when a synthesizer follows
        self._unanswered: int | None = None
        self._on_all_answered: Callable[[], None] | None = None

    def expect_answers(self, count: int, then: Callable[[], None] | None) -> None:
        """The workers' phase begins: `count` workers are yet to answer; `then` runs once the
        last has (not when the swarm is stopping)."""
        self._unanswered, self._on_all_answered = count, then

    def no_more_answers(self) -> None:
        """The workers' phase is over; its callback is dropped (it refers to the executor,
        which is the run's)."""
        self._unanswered, self._on_all_answered = None, None

    def answered(self, sub: Subtask) -> None:
        """A subtask's final state is about to be queued for its commit (not yet durable)."""
        if sub.kind is SubtaskKind.worker:
            self._one_less_unanswered()

    def _one_less_unanswered(self) -> None:
        if self._unanswered is None:
            return
        self._unanswered -= 1
        if self._unanswered <= 0 and not self.state.stopping and self._on_all_answered:
            then, self._on_all_answered = self._on_all_answered, None
            then()

    def last_answer(self, sub: Subtask) -> bool:
        """Whether this worker's success (already `answered`) is the swarm's last result
        before its end: every other worker has answered, no synthesizer follows, and the
        swarm is neither stopping nor draining. It is then written with the end."""
        state = self.state
        return (sub.kind is SubtaskKind.worker and self._unanswered == 0
                and not state.stopping and not state.draining
                and state.synthesizer() is None)

    def on_failure(self, name: str) -> None:
        """A subtask failed (its failure committed): a worker's dependents are skipped unless
        its failure passes the tolerance."""
        if self.state.subs[name].kind != SubtaskKind.worker:
            return
        if not self.past_tolerance():
            self.skip_dependents(name)

    def failing(self, name: str, error: dict[str, Any]) -> None:
        """A worker's call failed for good, its slot still held: when its failure passes the
        tolerance the swarm stops now, so that a subtask waiting for that slot is not sent
        (`on_failure`, after the failure's commit, came a turn too late)."""
        if self.state.subs[name].kind == SubtaskKind.worker:
            self.past_tolerance(failing=(name, error))

    def past_tolerance(self, failing: tuple[str, dict[str, Any]] | None = None) -> bool:
        """Whether the failed workers (and `failing`, a name and its error) exceed the
        tolerance: then the swarm stops, failed `failure_tolerance_exceeded`, its details
        counting the subtasks' error codes so the cause is read on the swarm."""
        state = self.state
        workers = state.worker_names()
        errors = {s.name: s.error for s in (state.subs[n] for n in workers)
                  if s.status == SubtaskStatus.failed}
        if failing is not None:
            errors[failing[0]] = failing[1]
        tolerance = float(state.limits["failure_tolerance"])
        if len(errors) / len(workers) <= tolerance:
            return False
        state.stop_with(SwarmStatus.failed, failure(
            "failure_tolerance_exceeded",
            f"{len(errors)} of {len(workers)} subtasks failed "
            f"(tolerance {tolerance})", failed=list(errors), **failure_causes(errors)))
        return True

    def skip_dependents(self, name: str) -> None:
        below = dag.descendants(self.state.deps, [name])
        subs = self.state.subs
        self.skip([n for n in below if subs[n].kind == SubtaskKind.worker],
                  f"dependency {name} did not succeed")

    def skip(self, names: list[str], reason: str) -> None:
        state, now = self.state, utcnow()
        changed: list[Subtask] = []
        events: list[EventRow] = []
        for n in sorted(names, key=lambda n: state.subs[n].position):
            s = state.subs[n]
            if s.status == SubtaskStatus.pending:
                skipped = move_subtask(s, SubtaskStatus.skipped, now, reason=reason)
                assert skipped is not None
                s.error = failure("skipped", reason)
                changed.append(s)
                events.append(state.event(skipped))
                if s.kind is SubtaskKind.worker:
                    self._one_less_unanswered()
        if changed:
            state.journal.commit_soon(changed, events=events)
