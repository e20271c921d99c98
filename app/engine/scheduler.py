"""The engine loop of a process: claim swarms, run them, keep their leases, stop gracefully."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import socket
import uuid
from contextlib import suppress

from app import metrics
from app.aio import woken
from app.config import Settings
from app.db import leases, spend
from app.db.dialect import ChangeListener, change_listener
from app.db.notify import CANCEL, QUEUED
from app.db.retry import log_db_failure
from app.db.session import SessionFactory
from app.db.tables import Subtask, Swarm
from app.engine import approval
from app.engine.budget import SharedCap
from app.engine.owned_swarm import EngineContext
from app.engine.runner import SwarmRunner
from app.engine.tenancy import TenantGates
from app.engine.waiters import SwarmNotifier
from app.engine.writer import StateWriter
from app.gateway.client import GatewayClient
from app.tools.registry import ToolRegistry

log = logging.getLogger(__name__)


def process_owner() -> str:
    """A lease owner id unique to this process (host, pid, random suffix)."""
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Scheduler:
    """Claims queued (or abandoned) swarms up to capacity and drives each with a SwarmRunner.

    Shaped after procrastinate's worker: a stop event, bounded fan-out, named tasks released by
    a done-callback, side tasks (claiming, heartbeat) watched together, graceful shutdown.
    """

    def __init__(self, settings: Settings, sessions: SessionFactory, gateway: GatewayClient,
                 notifier: SwarmNotifier | None = None, owner: str | None = None,
                 daily: SharedCap | None = None, tools: ToolRegistry | None = None) -> None:
        self.settings = settings
        self.sessions = sessions
        self.owner = owner or process_owner()
        self.notifier = notifier or SwarmNotifier()
        self.notifier.runs_here = self.runs_here
        tenants = TenantGates(settings.tenants, sessions, self.owner, settings.lease_seconds,
                              daily)
        self.writer = StateWriter(sessions, self.owner, retry_for_s=settings.lease_seconds,
                                  on_commit=self.notifier.notify, holding=self.runs_here,
                                  on_settled=tenants.settled)
        self.ctx = EngineContext(
            settings=settings, prices=settings.prices, gateway=gateway, writer=self.writer,
            owner=self.owner, inflight=asyncio.Semaphore(settings.max_inflight),
            model_slots={n: asyncio.Semaphore(settings.prices[n].concurrency or 1)
                         for n in settings.prices.names()
                         if settings.prices[n].concurrency},
            daily=daily, tools=tools, notifier=self.notifier,
            tenants=tenants,
        )
        self.runners: dict[str, tuple[SwarmRunner, asyncio.Task[None]]] = {}
        self._wake = asyncio.Event()
        self._claims_stopped = asyncio.Event()
        self._heartbeat_stopped = asyncio.Event()  # set after the runners: leases stop renewing
        self._side: list[asyncio.Task[None]] = []
        self._claims: asyncio.Task[None] | None = None
        self._listener: ChangeListener | None = None
        # set when a side task ends on its own: the process looks alive but claims, keeps
        # leases or commits nothing, so its entry point stops it loudly for a restart
        self.died = asyncio.Event()
        self.death: str | None = None

    async def start(self) -> None:
        self.writer.start()
        self._listener = change_listener(
            self.settings.database_url, {QUEUED: self._on_queued, CANCEL: self._on_cancel},
            on_connect=self.wake)
        if self._listener is not None:
            self._listener.start()
        self._claims = asyncio.create_task(self._claim_loop(), name="engine-claims")
        self._side = [self._claims,
                      asyncio.create_task(self._heartbeat_loop(), name="engine-heartbeat")]
        watched = [*self._side, self.writer.task]
        if self._listener is not None:
            watched.append(self._listener.task)
        for task in watched:
            if task is not None:
                task.add_done_callback(self._side_task_done)

    def _side_task_done(self, task: asyncio.Task[None]) -> None:
        """The side-task monitor (after procrastinate's): a claim loop, heartbeat, state
        writer or listener that ends before a stop was asked for is fatal to the process."""
        if self._claims_stopped.is_set() or self._heartbeat_stopped.is_set() or self.died.is_set():
            return
        exc = None if task.cancelled() else task.exception()
        self.death = f"{task.get_name()} ended unexpectedly: {exc!r}"
        log.critical("engine side task %s", self.death, exc_info=exc)
        self.died.set()

    def _on_queued(self, _swarm_id: str) -> None:
        self.wake()

    def _on_cancel(self, swarm_id: str) -> None:
        self.cancel_local(swarm_id)

    def wake(self) -> None:
        """A swarm was queued in this process: claim now instead of at the next poll."""
        self._wake.set()

    def cancel_local(self, swarm_id: str) -> bool:
        """Cancel a swarm this process drives, at once; False when it is not here."""
        entry = self.runners.get(swarm_id)
        if entry is None:
            return False
        entry[0].request_cancel()
        return True

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop claiming and launching; let in-flight calls finish (and commit) up to the grace
        period; cancel what is left; release every unfinished swarm so another process
        continues it at once."""
        grace = self.settings.shutdown_grace_s if grace_s is None else grace_s
        self._claims_stopped.set()
        self._wake.set()
        if self._listener is not None:
            await self._listener.stop()
        if self._claims is not None:
            # a claim the stop met mid-transaction still launches its runners: they are drained
            # and released with the others, never left to a lease that has to expire
            await asyncio.wait([self._claims], timeout=5)
        entries = list(self.runners.items())
        for _, (runner, _task) in entries:
            runner.drain()
        tasks = [t for _, (_r, t) in entries]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        for task in tasks:
            task.cancel()
        # the side loops see the stop events and end between transactions; cancelling one
        # inside a transaction would leave SQLite's write lock held until its busy timeout
        self._heartbeat_stopped.set()
        if self._side:
            await asyncio.wait(self._side, timeout=5)
        for task in self._side:
            task.cancel()
        await asyncio.gather(*tasks, *self._side, return_exceptions=True)
        await self.writer.close()
        if self.ctx.tenants is not None:
            await self.ctx.tenants.close()
        unfinished = [sid for sid, (runner, _t) in entries if not runner.finished]
        if unfinished:
            with suppress(Exception):
                async with self.sessions() as session, session.begin():
                    await leases.release_leases(session, self.owner, unfinished)
            log.info("released %d unfinished swarms for another process", len(unfinished))

    # ---- side tasks -----------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        # after a failed claim the next comes soon (0.25 s, doubling): the wake-up that asked
        # for it is spent, and a poll interval can be a minute where LISTEN does the waking
        retry_s = 0.0
        while not self._claims_stopped.is_set():
            poll = self.settings.poll_interval_s * (0.5 + random.random())
            try:
                await self._claim_some()
                retry_s = 0.0
            except Exception as exc:
                log_db_failure(log, "claiming", exc)
                retry_s = min(max(retry_s * 2, 0.25), poll)
                poll = retry_s
            await woken(self._wake, poll)
            self._wake.clear()

    async def _claim_some(self) -> None:
        capacity = self.settings.max_running_swarms - len(self.runners)
        if capacity <= 0:
            return
        async with self.sessions() as session, session.begin():
            claims = await leases.claim_swarms(
                session, self.owner, self.settings.lease_seconds, capacity,
                exclude=list(self.runners))
            loaded = await leases.load_swarms_for_run(session, [c.swarm_id for c in claims])
        for claim in claims:
            swarm, subs = loaded[claim.swarm_id]
            if claim.takeover is not None and not approval.requeued(swarm):
                metrics.child(metrics.takeovers, claim.takeover).inc()
            self._drive(SwarmRunner(self.ctx, swarm, subs, claim.epoch, claim.rescues))
        if len(claims) == capacity:
            self._wake.set()  # there may be more waiting

    def runs_here(self, swarm_id: str) -> bool:
        return swarm_id in self.runners

    def has_capacity(self) -> bool:
        return (not self._claims_stopped.is_set()
                and len(self.runners) < self.settings.max_running_swarms)

    def adoption(self, swarm: Swarm, subtasks: list[Subtask]) -> SwarmRunner:
        """The runner of a swarm this process is about to claim as it creates it (epoch 1),
        not started: its `first_wave` rows go in the creation's statement, and `adopt`
        drives it once that statement committed (dropped, it leaves nothing behind)."""
        return SwarmRunner(self.ctx, swarm, subtasks, 1, 0)

    def adopt(self, runner: SwarmRunner) -> None:
        """Drive a swarm this process claimed as it created it: no wake-up, no reload."""
        self._drive(runner)

    def _drive(self, runner: SwarmRunner) -> None:
        swarm_id = runner.swarm.id
        task = asyncio.create_task(runner.run(), name=f"swarm:{swarm_id}")
        self.runners[swarm_id] = (runner, task)
        task.add_done_callback(functools.partial(self._done, swarm_id))

    def _done(self, swarm_id: str, task: asyncio.Task[None]) -> None:
        entry = self.runners.get(swarm_id)
        if entry is not None and entry[1] is task:  # never drop a newer runner of the swarm
            # the place it frees matters only to a full process: one with room has claimed
            # what it could (a claim query per finished swarm was ~9 % of `serve`'s CPU
            # creating 1-agent swarms one at a time)
            if len(self.runners) >= self.settings.max_running_swarms:
                self._wake.set()
            del self.runners[swarm_id]
            if not entry[0].finished:  # stopped without offering its rows: readers re-read
                self.notifier.notify(swarm_id)
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, leases.LeaseLost):
            log.warning("swarm %s: lease lost, stopped driving it", swarm_id)
        elif exc is not None:
            log.error("swarm %s: runner crashed", swarm_id, exc_info=exc)

    async def _heartbeat_loop(self) -> None:
        # often enough that a cancel flagged by another process lands within a second
        interval = min(self.settings.lease_seconds / 3, 0.5)
        # runs on through a shutdown's grace period: draining swarms keep their leases
        while not self._heartbeat_stopped.is_set():
            await woken(self._heartbeat_stopped, interval)
            if self._heartbeat_stopped.is_set():
                return
            if self.runners:
                # a method of its own: a loop's locals would hold the last runner it looked
                # at (a whole finished swarm) for as long as the process is idle
                await self._extend_leases()

    async def _extend_leases(self) -> None:
        epochs = {sid: r.epoch for sid, (r, _) in self.runners.items()}
        ctx = self.ctx
        reserved = [*(ctx.daily.held_ids() if ctx.daily is not None else ()),
                    *(ctx.tenants.held_ids() if ctx.tenants is not None else ())]
        try:
            async with self.sessions() as session, session.begin():
                held = await leases.extend_leases(
                    session, self.owner, epochs, self.settings.lease_seconds)
                if held:  # its reservations live as long as its leases
                    await spend.refresh_owned(session, self.owner, reserved,
                                              self.settings.lease_seconds)
        except Exception as exc:
            log_db_failure(log, "heartbeat", exc)
            return
        for sid in epochs:
            entry = self.runners.get(sid)
            if entry is None:
                continue
            if sid not in held:
                log.warning("swarm %s: lease lost to another process", sid)
                entry[1].cancel()
            elif held[sid]:
                entry[0].request_cancel()

