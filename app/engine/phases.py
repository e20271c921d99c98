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
from app.engine.ends import SwarmEnds
from app.engine.execute import SubtaskExecutor
from app.engine.handle import Outcome
from app.engine.subtask_rows import PLANNER, synthesizer
from app.engine.synthesis import WorkerResult, tally
from app.states import SubtaskStatus, SwarmStatus


class Drained(Exception):
    """The runner stopped for a shutdown with the swarm unfinished."""


class Parked(Exception):
    """The runner stopped with the swarm held for approval (its lease given up)."""


class SwarmPhases(SwarmEnds):
    """The runner's phases, in the order `SwarmRunner._run` calls them."""

    async def _plan(self, executor: SubtaskExecutor) -> None:
        planner = self.subs.get(PLANNER)
        if planner is None:
            return
        if planner.status != SubtaskStatus.succeeded:
            await self._run_phase(executor, [PLANNER])
        if planner.status == SubtaskStatus.succeeded:
            if self.swarm.status == SwarmStatus.planning and not self._approval_pending():
                self.journal.commit_soon(events=[self._set_status(SwarmStatus.running)])
        elif not self._stop.is_set():
            self.stop_with(SwarmStatus.failed, planner.error)

    def _approval_pending(self) -> bool:
        """The limits name an approval rule and nobody has decided on this plan yet."""
        return approval.asks(self.limits) and self.swarm.approval is None

    async def _hold(self, executor: SubtaskExecutor) -> None:
        """The approval gate, once the plan is known (SPEC §14): a plan that needs approval
        parks the swarm (Parked: its lease given up, nothing more called), else it runs."""
        if not self._approval_pending():
            return
        subs = list(self.subs.values())
        estimate = await gate.estimate_planned(self.ctx, self.swarm, subs)
        if approval.needed(self.limits, estimate):
            await self.journal.commit()  # what came before is durable before the lease goes
            if self._stop.is_set():  # cancelled meanwhile: it ends, never held
                return
            if await gate.park(self.ctx.writer, self.swarm, subs, estimate, self.ctx.owner,
                               self.epoch):
                raise Parked
            raise LeaseLost(self.swarm.id)
        self.swarm.approval = {"state": "auto", "estimate": estimate}
        metrics.approvals.labels("auto").inc()
        if self.swarm.status in (SwarmStatus.queued, SwarmStatus.planning):
            self.journal.commit_soon(events=[self._set_status(SwarmStatus.running)])

    async def _run_workers(self, executor: SubtaskExecutor) -> None:
        for name in self.worker_names():
            if self.subs[name].status in (SubtaskStatus.failed, SubtaskStatus.skipped):
                self._skip_dependents(name)
        self._unanswered = sum(self.subs[n].status == SubtaskStatus.pending
                               for n in self.worker_names())
        synth = self._synthesizer()
        if synth is not None and synth.status == SubtaskStatus.pending:
            # once every worker has answered, the synthesizer's call is prepared on those
            # answers while they are committed (SubtaskExecutor.prepare): its first attempt's
            # write-ahead goes in the same commit as the last results, not in one after it
            self._on_all_answered = lambda: executor.prepare(synth)
        try:
            await self._run_phase(executor, self.worker_names())
        finally:
            self._unanswered = None
            self._on_all_answered = None  # the executor is the run's (see _run)

    async def _synthesize(self, executor: SubtaskExecutor) -> None:
        results = self.worker_results()
        synth = self._synthesizer()  # `synthesize`, or a vote without a majority
        if synth is None and self.spec["synthesis"]["strategy"] == "vote":
            synth = await self._vote(results)
        if synth is not None:
            if not results:
                self._skip([synth.name], "no worker succeeded")
                return
            if synth.status != SubtaskStatus.succeeded:
                if self.swarm.status != SwarmStatus.synthesizing:  # not after a takeover
                    self.journal.commit_soon(events=[self._set_status(SwarmStatus.synthesizing)])
                await self._run_phase(executor, [synth.name])
            if synth.status == SubtaskStatus.succeeded:
                self.swarm.result = synth.output
            elif not self._stop.is_set():
                self.stop_with(SwarmStatus.failed, synth.error)
        else:
            self.swarm.result = self._combined(results)

    async def _vote(self, results: list[WorkerResult]) -> Subtask | None:
        """Count the workers' answers (the swarm's `vote`): the winner's is the result; when
        no two agree, a synthesizer merges them instead, added now and returned (SPEC §3)."""
        counted = tally(results)
        if counted is None:
            return None
        self.swarm.vote = counted.block()
        if counted.outcome != "no_majority":
            self.swarm.result = counted.answer
            return None
        copied = self._synthesizer()  # a retry's copy of the one an earlier run added
        if copied is not None:
            await self.journal.commit()  # the count, before the synthesis it decided
            return copied
        position = max(s.position for s in self.subs.values()) + 1
        synth = synthesizer(self.swarm.id, self.spec, position, [r.name for r in results])
        self.add_subtasks([synth])
        added = self.subs[synth.name]
        # its row (and the count), before its start is written
        await self.journal.commit(new=[added])
        return added

    async def _run_phase(self, executor: SubtaskExecutor, names: list[str]) -> None:
        """Start each subtask as soon as its dependencies succeeded and a slot is free."""
        in_phase = set(names)
        ts: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter(
            {n: [d for d in self.deps[n] if d in in_phase] for n in names})
        ts.prepare()
        ready: deque[str] = deque()
        running: dict[asyncio.Task[Outcome], str] = {}
        # every task puts itself here when done, once: a completion costs O(1), where
        # asyncio.wait over the running tasks added and removed a callback on each of them
        # per wake-up (O(in flight) per completion: 256 x 1,000 for a 1,000-agent swarm)
        finished: asyncio.Queue[asyncio.Future[Any]] = asyncio.Queue()
        stop_wait = asyncio.create_task(self._stop.wait())
        drain_wait = asyncio.create_task(self._drain.wait())
        stop_wait.add_done_callback(finished.put_nowait)
        drain_wait.add_done_callback(finished.put_nowait)
        # twice the slots: the subtasks in calls, and as many again whose answers are being
        # committed (a task per slot only kept each slot idle for a commit per subtask)
        tasks = 2 * int(self.limits["concurrency"])
        try:
            while True:
                self._collect_ready(ts, ready)
                self._launch(executor, ready, running, tasks, finished)
                if self._drain.is_set() and not running and not self._stop.is_set():
                    raise Drained
                if self._stop.is_set() or not running:
                    return
                timeout = self.deadline - time.monotonic()
                if timeout <= 0:
                    self.stop_with(SwarmStatus.failed, self.deadline_error())
                    return
                for task in await self._completed(finished, timeout):
                    name = running.pop(task, None)  # type: ignore[call-overload]
                    if name is None:  # stop_wait or drain_wait: the checks above act on it
                        continue
                    outcome = task.result()
                    if outcome is Outcome.succeeded:
                        ts.done(name)
                    elif outcome is Outcome.failed:
                        self._on_failure(name)
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
        while ready and len(running) < tasks and not (
            self._stop.is_set() or self._drain.is_set()
        ):
            name = ready.popleft()
            if self.subs[name].status == SubtaskStatus.pending:
                task = asyncio.create_task(executor.run(self.subs[name]))
                task.add_done_callback(finished.put_nowait)
                running[task] = name

    def _collect_ready(self, ts: graphlib.TopologicalSorter[str], ready: deque[str]) -> None:
        now = utcnow()
        while batch := sorted(ts.get_ready(), key=lambda n: self.subs[n].position):
            for name in batch:
                s = self.subs[name]
                if s.status == SubtaskStatus.succeeded:
                    ts.done(name)  # finished before a takeover: never called again
                elif s.status == SubtaskStatus.pending:
                    s.ready_at = s.ready_at or now
                    ready.append(name)
