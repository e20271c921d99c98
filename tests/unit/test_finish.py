"""How a swarm ends (app/engine/finish.py), without a database: the one path shared by the
runner's finish and the cancel of a queued swarm."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.db.tables import Subtask, Swarm
from app.engine.finish import end_swarm
from app.engine.subtask_rows import new_subtask
from app.states import SubtaskKind, SubtaskStatus, SwarmStatus

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
S, T = SwarmStatus, SubtaskStatus


def swarm(status: SwarmStatus = S.running, webhook: str | None = None) -> Swarm:
    spec: dict[str, Any] = {"limits": {}, "synthesis": {"strategy": "concatenate"}}
    if webhook:
        spec["webhook_url"] = webhook
    return Swarm(id="s1", tenant="t", status=status, spec=spec, event_seq=3,
                 started_at=None if status is S.queued else NOW, finished_at=None, error=None)


def subs(*states: SubtaskStatus) -> list[Subtask]:
    out = []
    for i, st in enumerate(states):
        s = new_subtask("s1", f"a{i}", i, SubtaskKind.worker, "m", 10)
        s.status = st
        out.append(s)
    return out


def test_a_failure_skips_what_waits_and_cancels_what_runs() -> None:
    sw, ss = swarm(), subs(T.succeeded, T.running, T.pending, T.failed)
    end = end_swarm(sw, ss, S.failed, {"code": "failure_tolerance_exceeded"}, NOW)
    assert [s.status for s in ss] == [T.succeeded, T.cancelled, T.skipped, T.failed]
    assert [s.name for s in end.changed] == ["a1", "a2"]
    assert all(s.finished_at == NOW for s in end.changed)
    assert [(e["seq"], e["type"]) for e in end.events] == [
        (4, "subtask.skipped"), (5, "swarm.completed")]
    assert end.events[-1]["data"] == {"status": "failed", "cancelled": ["a1"],
                                      "error": {"code": "failure_tolerance_exceeded"}}
    assert (sw.status, sw.finished_at, sw.event_seq) == (S.failed, NOW, 5)
    assert sw.error == {"code": "failure_tolerance_exceeded"}
    assert end.webhook is None


def test_a_cancel_or_a_deadline_cancels_what_waits_too() -> None:
    for status, err in [(S.cancelled, None), (S.failed, {"code": "deadline_exceeded"})]:
        sw, ss = swarm(), subs(T.pending, T.running, T.succeeded)
        end = end_swarm(sw, ss, status, err, NOW)
        assert [s.status for s in ss] == [T.cancelled, T.cancelled, T.succeeded]
        assert [e["type"] for e in end.events] == ["swarm.completed"]
        assert end.events[0]["data"]["cancelled"] == ["a0", "a1"]


def test_a_queued_swarm_cancelled_gets_its_webhook_and_never_started() -> None:
    sw, ss = swarm(S.queued, webhook="https://example.com/h"), subs(T.pending)
    end = end_swarm(sw, ss, S.cancelled, None, NOW)
    assert (sw.status, sw.started_at, sw.finished_at) == (S.cancelled, None, NOW)
    assert end.webhook is not None
    assert (end.webhook["swarm_id"], end.webhook["url"], end.webhook["state"]) == (
        "s1", "https://example.com/h", "pending")
    assert end.events[0]["data"] == {"status": "cancelled", "error": None, "cancelled": ["a0"]}
