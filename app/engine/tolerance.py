"""A swarm's failure tolerance: which workers have answered, a failed worker's dependents
skipped, and the swarm stopped once its failed workers pass `limits.failure_tolerance`."""

from __future__ import annotations

from typing import Any

from app.db.tables import Subtask
from app.db.types import utcnow
from app.engine import dag
from app.engine.handle import EventRow, failure, failure_causes
from app.engine.run_state import RunnerState
from app.states import SubtaskKind, SubtaskStatus, SwarmStatus, move_subtask


class FailureTolerance(RunnerState):
    """The runner's bookkeeping of failed and answered workers."""

    def answered(self, sub: Subtask) -> None:
        """A subtask's final state is about to be queued for its commit (not yet durable)."""
        if sub.kind is SubtaskKind.worker:
            self._one_less_unanswered()

    def _one_less_unanswered(self) -> None:
        if self._unanswered is None:
            return
        self._unanswered -= 1
        if self._unanswered <= 0 and not self._stop.is_set() and self._on_all_answered:
            then, self._on_all_answered = self._on_all_answered, None
            then()

    def last_answer(self, sub: Subtask) -> bool:
        """Whether this worker's success (already `answered`) is the swarm's last result
        before its end: every other worker has answered, no synthesizer follows, and the
        swarm is neither stopping nor draining. It is then written with the end."""
        return (sub.kind is SubtaskKind.worker and self._unanswered == 0
                and not self._stop.is_set() and not self._drain.is_set()
                and self._synthesizer() is None)

    def _on_failure(self, name: str) -> None:
        if self.subs[name].kind != SubtaskKind.worker:
            return
        if not self._past_tolerance():
            self._skip_dependents(name)

    def failing(self, name: str, error: dict[str, Any]) -> None:
        """A worker's call failed for good, its slot still held: when its failure passes the
        tolerance the swarm stops now, so that a subtask waiting for that slot is not sent
        (`_on_failure`, after the failure's commit, came a turn too late)."""
        if self.subs[name].kind == SubtaskKind.worker:
            self._past_tolerance(failing=(name, error))

    def _past_tolerance(self, failing: tuple[str, dict[str, Any]] | None = None) -> bool:
        """Whether the failed workers (and `failing`, a name and its error) exceed the
        tolerance: then the swarm stops, failed `failure_tolerance_exceeded`, its details
        counting the subtasks' error codes so the cause is read on the swarm."""
        errors = {s.name: s.error for s in (self.subs[n] for n in self.worker_names())
                  if s.status == SubtaskStatus.failed}
        if failing is not None:
            errors[failing[0]] = failing[1]
        tolerance = float(self.limits["failure_tolerance"])
        if len(errors) / len(self.worker_names()) <= tolerance:
            return False
        self.stop_with(SwarmStatus.failed, failure(
            "failure_tolerance_exceeded",
            f"{len(errors)} of {len(self.worker_names())} subtasks failed "
            f"(tolerance {tolerance})", failed=list(errors), **failure_causes(errors)))
        return True

    def _skip_dependents(self, name: str) -> None:
        below = dag.descendants(self.deps, [name])
        self._skip([n for n in below if self.subs[n].kind == SubtaskKind.worker],
                   f"dependency {name} did not succeed")

    def _skip(self, names: list[str], reason: str) -> None:
        now = utcnow()
        changed: list[Subtask] = []
        events: list[EventRow] = []
        for n in sorted(names, key=lambda n: self.subs[n].position):
            s = self.subs[n]
            if s.status == SubtaskStatus.pending:
                skipped = move_subtask(s, SubtaskStatus.skipped, now, reason=reason)
                assert skipped is not None
                s.error = failure("skipped", reason)
                changed.append(s)
                events.append(self.event(skipped))
                if s.kind is SubtaskKind.worker:
                    self._one_less_unanswered()
        if changed:
            self.journal.commit_soon(changed, events=events)
