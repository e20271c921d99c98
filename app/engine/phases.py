"""A swarm's phases: planning, the approval gate, the workers, the synthesis; each phase runs
its subtasks as their dependencies succeed and slots free up."""

from __future__ import annotations

import asyncio
import graphlib
import time
from collections import deque
from typing import Any

from app import metrics
from app.db.leases import LeaseLost
from app.db.tables import Subtask
from app.db.types import utcnow
from app.engine import approval, gate
from app.engine.execute import SubtaskExecutor
from app.engine.owned_swarm import Outcome
from app.engine.run_state import RunnerState
from app.engine.subtask_rows import PLANNER, synthesizer
from app.engine.synthesis import WorkerResult, tally
from app.engine.tolerance import FailureTolerance
from app.states import SubtaskStatus, SwarmStatus


class Drained(Exception):
    """The runner stopped for a shutdown with the swarm unfinished."""


class Parked(Exception):
    """The runner stopped with the swarm held for approval (its lease given up)."""


class SwarmPhases:
    """The run's phase loop, over its state, asking its failure tolerance; `SwarmRunner._run`
    calls the phases in turn: plan, hold, run_workers, synthesize."""

    def __init__(self, state: RunnerState, tolerance: FailureTolerance) -> None:
        self.state = state
        self.tolerance = tolerance

    async def plan(self, executor: SubtaskExecutor) -> None:
        state = self.state
        planner = state.subs.get(PLANNER)
        if planner is None:
            return
        if planner.status != SubtaskStatus.succeeded:
            await self._run_phase(executor, [PLANNER])
        if planner.status == SubtaskStatus.succeeded:
            if state.swarm.status == SwarmStatus.planning and not self.approval_pending():
                state.journal.commit_soon(events=[state.set_status(SwarmStatus.running)])
        elif not state.stopping:
            state.stop_with(SwarmStatus.failed, planner.error)

    def approval_pending(self) -> bool:
        """The limits name an approval rule and nobody has decided on this plan yet."""
        return approval.asks(self.state.limits) and self.state.swarm.approval is None

    async def hold(self, executor: SubtaskExecutor) -> None:
        """The approval gate, once the plan is known (SPEC §14): a plan that needs approval
        parks the swarm (Parked: its lease given up, nothing more called), else it runs."""
        if not self.approval_pending():
            return
        state, swarm = self.state, self.state.swarm
        subs = list(state.subs.values())
        estimate = await gate.estimate_planned(state.ctx, swarm, subs)
        if approval.needed(state.limits, estimate):
            await state.journal.commit()  # what came before is durable before the lease goes
            if state.stopping:  # cancelled meanwhile: it ends, never held
                return
            if await gate.park(state.ctx.writer, swarm, subs, estimate, state.ctx.owner,
                               state.epoch):
                raise Parked
            raise LeaseLost(swarm.id)
        swarm.approval = {"state": "auto", "estimate": estimate}
        metrics.approvals.labels("auto").inc()
        if swarm.status in (SwarmStatus.queued, SwarmStatus.planning):
            state.journal.commit_soon(events=[state.set_status(SwarmStatus.running)])

    async def run_workers(self, executor: SubtaskExecutor) -> None:
        state, tolerance = self.state, self.tolerance
        for name in state.worker_names():
            if state.subs[name].status in (SubtaskStatus.failed, SubtaskStatus.skipped):
                tolerance.skip_dependents(name)
        pending = sum(state.subs[n].status == SubtaskStatus.pending
                      for n in state.worker_names())
        synth = state.synthesizer()
        if synth is not None and synth.status == SubtaskStatus.pending:
            # once every worker has answered, the synthesizer's call is prepared on those
            # answers while they are committed (SubtaskExecutor.prepare): its first attempt's
            # write-ahead goes in the same commit as the last results, not in one after it
            tolerance.expect_answers(pending, lambda: executor.prepare(synth))
        else:
            tolerance.expect_answers(pending, None)
        try:
            await self._run_phase(executor, state.worker_names())
        finally:
            tolerance.no_more_answers()  # the executor is the run's (see SwarmRunner._run)

    async def synthesize(self, executor: SubtaskExecutor) -> None:
        state, swarm = self.state, self.state.swarm
        results = state.worker_results()
        synth = state.synthesizer()  # `synthesize`, or a vote without a majority
        if synth is None and state.spec["synthesis"]["strategy"] == "vote":
            synth = await self._vote(results)
        if synth is not None:
            if not results:
                self.tolerance.skip([synth.name], "no worker succeeded")
                return
            if synth.status != SubtaskStatus.succeeded:
                if swarm.status != SwarmStatus.synthesizing:  # not after a takeover
                    state.journal.commit_soon(
                        events=[state.set_status(SwarmStatus.synthesizing)])
                await self._run_phase(executor, [synth.name])
            if synth.status == SubtaskStatus.succeeded:
                swarm.result = synth.output
            elif not state.stopping:
                state.stop_with(SwarmStatus.failed, synth.error)
        else:
            swarm.result = state.combined(results)

    async def _vote(self, results: list[WorkerResult]) -> Subtask | None:
        """Count the workers' answers (the swarm's `vote`): the winner's is the result; when
        no two agree, a synthesizer merges them instead, added now and returned (SPEC §3)."""
        state, swarm = self.state, self.state.swarm
        counted = tally(results)
        if counted is None:
            return None
        swarm.vote = counted.block()
        if counted.outcome != "no_majority":
            swarm.result = counted.answer
            return None
        copied = state.synthesizer()  # a retry's copy of the one an earlier run added
        if copied is not None:
            await state.journal.commit()  # the count, before the synthesis it decided
            return copied
        position = max(s.position for s in state.subs.values()) + 1
        synth = synthesizer(swarm.id, state.spec, position, [r.name for r in results])
        state.add_subtasks([synth])
        added = state.subs[synth.name]
        # its row (and the count), before its start is written
        await state.journal.commit(new=[added])
        return added

    async def _run_phase(self, executor: SubtaskExecutor, names: list[str]) -> None:
        """Start each subtask as soon as its dependencies succeeded and a slot is free."""
        state, in_phase = self.state, set(names)
        ts: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter(
            {n: [d for d in state.deps[n] if d in in_phase] for n in names})
        ts.prepare()
        ready: deque[str] = deque()
        running: dict[asyncio.Task[Outcome], str] = {}
        # every task puts itself here when done, once: a completion costs O(1), where
        # asyncio.wait over the running tasks added and removed a callback on each of them
        # per wake-up (O(in flight) per completion: 256 x 1,000 for a 1,000-agent swarm)
        finished: asyncio.Queue[asyncio.Future[Any]] = asyncio.Queue()
        stop_wait = asyncio.create_task(state.stopped())
        drain_wait = asyncio.create_task(state.drained())
        stop_wait.add_done_callback(finished.put_nowait)
        drain_wait.add_done_callback(finished.put_nowait)
        # twice the slots: the subtasks in calls, and as many again whose answers are being
        # committed (a task per slot only kept each slot idle for a commit per subtask)
        tasks = 2 * int(state.limits["concurrency"])
        try:
            while True:
                self._collect_ready(ts, ready)
                self._launch(executor, ready, running, tasks, finished)
                if state.draining and not running and not state.stopping:
                    raise Drained
                if state.stopping or not running:
                    return
                timeout = state.deadline - time.monotonic()
                if timeout <= 0:
                    state.stop_with(SwarmStatus.failed, state.deadline_error())
                    return
                for task in await self._completed(finished, timeout):
                    name = running.pop(task, None)  # type: ignore[call-overload]
                    if name is None:  # stop_wait or drain_wait: the checks above act on it
                        continue
                    outcome = task.result()
                    if outcome is Outcome.succeeded:
                        ts.done(name)
                    elif outcome is Outcome.failed:
                        self.tolerance.on_failure(name)
        finally:
            stop_wait.cancel()
            drain_wait.cancel()
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    @staticmethod
    async def _completed(finished: asyncio.Queue[asyncio.Future[Any]],
                         timeout: float) -> list[asyncio.Future[Any]]:
        """What finished since the last look: at least one, or nothing once `timeout` passed
        (the caller checks the deadline)."""
        try:
            async with asyncio.timeout(timeout):
                done = [await finished.get()]
        except TimeoutError:
            return []
        while not finished.empty():
            done.append(finished.get_nowait())
        return done

    def _launch(self, executor: SubtaskExecutor, ready: deque[str],
                running: dict[asyncio.Task[Outcome], str], tasks: int,
                finished: asyncio.Queue[asyncio.Future[Any]]) -> None:
        """Start ready subtasks, up to `tasks` at once, while the swarm is neither stopping nor
        draining (each then waits for the swarm's call slot, in launch order)."""
        subs, state = self.state.subs, self.state
        while ready and len(running) < tasks and not (state.stopping or state.draining):
            name = ready.popleft()
            if subs[name].status == SubtaskStatus.pending:
                task = asyncio.create_task(executor.run(subs[name]))
                task.add_done_callback(finished.put_nowait)
                running[task] = name

    def _collect_ready(self, ts: graphlib.TopologicalSorter[str], ready: deque[str]) -> None:
        subs, now = self.state.subs, utcnow()
        while batch := sorted(ts.get_ready(), key=lambda n: subs[n].position):
            for name in batch:
                s = subs[name]
                if s.status == SubtaskStatus.succeeded:
                    ts.done(name)  # finished before a takeover: never called again
                elif s.status == SubtaskStatus.pending:
                    s.ready_at = s.ready_at or now
                    ready.append(name)
