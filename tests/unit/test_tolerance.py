"""A swarm's failure tolerance (app/engine/tolerance.py) as an object of its own over the run's
state, without a database; and OwnedRun, what the subtasks see of the two."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

from app.db.tables import Swarm
from app.engine.owned_run import OwnedRun
from app.engine.run_state import RunnerState
from app.engine.subtask_rows import new_subtask
from app.engine.tolerance import FailureTolerance
from app.states import SubtaskKind, SubtaskStatus, SwarmStatus

T = SubtaskStatus
ERROR = {"code": "upstream_error", "message": "502", "details": None}


class Writer:
    """The process's StateWriter: what it was given, each write durable at once."""

    def __init__(self) -> None:
        self.writes: list[Any] = []

    def submit(self, write: Any, *, linger: bool = False,
               meanwhile: Any = None) -> asyncio.Future[None]:
        self.writes.append(write)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def run(tolerance: float, *depends_on: list[str]) -> tuple[RunnerState, FailureTolerance, Writer]:
    """A running swarm of workers a0, a1, … (a worker's dependencies as given)."""
    spec = {"limits": {"concurrency": 4, "deadline_s": 60, "failure_tolerance": tolerance},
            "synthesis": {"strategy": "concatenate"}}
    swarm = Swarm(id="s1", tenant="t", status=SwarmStatus.running, spec=spec, event_seq=0,
                  budget_usd=Decimal(1), spent_usd=Decimal(0), unresolved_usd=Decimal(0))
    subs = [new_subtask("s1", f"a{i}", i, SubtaskKind.worker, "m", 10, depends_on=deps)
            for i, deps in enumerate(depends_on)]
    writer = Writer()
    ctx = SimpleNamespace(writer=writer, settings=SimpleNamespace(latency_devices=True))
    state = RunnerState(ctx, swarm, subs, epoch=1)  # type: ignore[arg-type]
    return state, FailureTolerance(state), writer


def fail(state: RunnerState, name: str) -> None:
    state.subs[name].status, state.subs[name].error = T.failed, ERROR


async def test_a_failure_within_the_tolerance_skips_the_workers_below_it() -> None:
    state, tolerance, writer = run(0.5, [], ["a0"], ["a1"], [])
    fail(state, "a0")
    tolerance.on_failure("a0")
    assert [s.status for s in state.subs.values()] == [T.failed, T.skipped, T.skipped, T.pending]
    assert state.subs["a2"].error == {"code": "skipped", "message": "dependency a0 did not succeed",
                                      "details": None}
    assert not state.stopping
    assert len(writer.writes) == 1  # the skips, in one write


async def test_past_the_tolerance_the_swarm_stops_with_its_causes_and_skips_nothing() -> None:
    state, tolerance, writer = run(0.25, [], ["a0"], [], [])
    fail(state, "a0")
    tolerance.on_failure("a0")  # 1 of 4: within
    assert not state.stopping and state.subs["a1"].status is T.skipped
    tolerance.failing("a2", ERROR)  # its slot still held: 2 of 4 stops the swarm now
    assert state.stopping and state.stop_status is SwarmStatus.failed
    err = state.stop_error
    assert err is not None and err["code"] == "failure_tolerance_exceeded"
    assert err["details"]["failed"] == ["a0", "a2"]
    assert err["details"]["causes"] == {"upstream_error": 2}
    assert state.subs["a3"].status is T.pending  # stopping: the end cancels it, not a skip
    assert len(writer.writes) == 1


async def test_the_last_answer_runs_what_waits_for_every_answer_once() -> None:
    state, tolerance, _ = run(0.0, [], [], [])
    calls: list[str] = []
    tolerance.expect_answers(2, lambda: calls.append("prepared"))
    a0, a1, a2 = state.subs.values()
    tolerance.answered(a0)
    assert calls == [] and not tolerance.last_answer(a0)
    tolerance.answered(a1)
    assert calls == ["prepared"]
    assert tolerance.last_answer(a1)  # no synthesizer follows: it is written with the end
    tolerance.answered(a2)
    assert calls == ["prepared"]
    tolerance.no_more_answers()
    assert not tolerance.last_answer(a2)


async def test_a_stopping_swarm_prepares_nothing_and_has_no_last_answer() -> None:
    state, tolerance, _ = run(0.0, [], [])
    calls: list[str] = []
    tolerance.expect_answers(1, lambda: calls.append("prepared"))
    state.request_cancel()
    a0 = state.subs["a0"]
    tolerance.answered(a0)
    assert calls == [] and not tolerance.last_answer(a0)


async def test_what_the_subtasks_see_follows_the_state_and_asks_the_tolerance() -> None:
    state, tolerance, _ = run(0.0, [], [])
    owned = OwnedRun(state, tolerance)
    assert owned.subs is state.subs and owned.swarm is state.swarm
    state.deadline = 12.5  # a takeover's start moves it after the executor was built
    assert owned.deadline == 12.5
    owned.failing("a1", ERROR)
    assert owned.stopping and state.stop_status is SwarmStatus.failed


async def test_the_chain_below_each_subtask_follows_the_graph_as_it_changes() -> None:
    state, tolerance, _ = run(0.0, [], ["a0"])
    owned = OwnedRun(state, tolerance)
    assert owned.chain_below() == {"a0": 2, "a1": 1}
    assert owned.chain_below() is owned.chain_below()  # once per graph, not per tool turn
    more = [new_subtask("s1", "a2", 2, SubtaskKind.worker, "m", 10, depends_on=["a1"])]
    owned.add_subtasks(more)
    assert owned.chain_below() == {"a0": 3, "a1": 2, "a2": 1}
    owned.forget_subtasks(more)
    assert owned.chain_below() == {"a0": 2, "a1": 1}
