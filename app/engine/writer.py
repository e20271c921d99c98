"""Group commit: the state writes of every runner in this process, one transaction per tick."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from app.aio import alongside, woken
from app.db.batches import group_commit, spend_only
from app.db.changes import SwarmWrite, TenantSettle
from app.db.leases import LeaseLost
from app.db.retry import database_unavailable, in_transaction
from app.db.session import SessionFactory
from app.text import storable

log = logging.getLogger(__name__)

Pending = tuple[SwarmWrite, asyncio.Future[None]]
# a queued write: its future, when it was queued (time.monotonic) and whether it lingers
_Queued = tuple[SwarmWrite, asyncio.Future[None], float, bool]
T = TypeVar("T")
# How long a write nobody waits for (a subtask's start, a status on the way) may wait for one
# somebody does, to share its commit: a subtask answered within it (a fast model, a cached
# answer) is written once, started and finished, where it was two commits; a wave's starts
# commit after its calls are sent, not between the sends. Readers see such a move this much
# later at most; nothing is reported before its commit. Writes with money in them never wait.
LINGER_S = 0.05
# A lingering write younger than this stays out of a commit that other swarms' writes start:
# the next write of its own swarm is likely near (a fast call's answer), and with it the
# move is one commit, not two (docs/decisions/0014-commits-that-wait-for-company.md). Older,
# it goes with any commit.
HOLD_S = 0.01


class WriteRejected(Exception):
    """The database refused this write's rows even alone (its text, say): nothing of it was
    stored but its money (ledger rows and the swarm's totals). The caller fails what it
    wrote instead."""


class StateWriter:
    """Collects writes while a transaction runs and commits them together in the next one.

    A write's future resolves only after its commit, so a subtask counts as done only once
    durable; batching costs milliseconds of latency, never durability.
    """

    def __init__(self, sessions: SessionFactory, owner: str, *, retry_for_s: float = 15.0,
                 max_batch: int = 500,
                 on_commit: Callable[[str, str | None], None] | None = None,
                 holding: Callable[[str], bool] | None = None,
                 on_settled: Callable[[list[TenantSettle], bool], None] | None = None
                 ) -> None:
        self._sessions = sessions
        self._commits = group_commit(sessions, owner, retry_for_s)
        self._on_commit = on_commit
        # told, once per write, whether the tenant cap settlements it carries were stored
        # (with its ledger rows) or never will be (fenced out, lost): their caps stop holding
        # the reservations either way (`TenantGates.settled`)
        self._on_settled = on_settled
        # whether this process still drives a swarm (its runner runs): while it does, a write
        # the database cannot take yet is retried past `retry_for_s` (money is never dropped);
        # None: every write gives up after the window
        self._holding = holding
        self._owner = owner
        self._retry_for_s = retry_for_s
        self._max_batch = max_batch
        self._queue: list[_Queued] = []
        # work to do while a write's statement runs (`submit`'s `meanwhile`), by its future
        self._meanwhile: dict[asyncio.Future[None], Callable[[], None]] = {}
        self._wake = asyncio.Event()  # a write is queued
        self._waited = asyncio.Event()  # ... and somebody waits for one (LINGER_S)
        self._task: asyncio.Task[None] | None = None
        # the loop the writer runs on, for its futures: 3.11's get_running_loop checks the
        # pid (a syscall) on each of the ~3 writes a subtask makes
        self._loop_of: asyncio.AbstractEventLoop | None = None
        self._closing = False

    @property
    def sessions(self) -> SessionFactory:
        """For the engine's few reads (a transcript after a takeover)."""
        return self._sessions

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="state-writer")
        self._loop_of = self._task.get_loop()

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    def submit(self, write: SwarmWrite, *, linger: bool = False,
               meanwhile: Callable[[], None] | None = None) -> asyncio.Future[None]:
        """Queue a write; await the future for durability (or LeaseLost). `linger`: nobody
        waits for it, and it may wait up to LINGER_S for a write somebody does. `meanwhile`:
        CPU work for once the write's statement is on its way (at most once, its errors
        logged): it runs while the database works, not after it answered."""
        fut: asyncio.Future[None] = (self._loop_of or asyncio.get_running_loop()).create_future()
        if self._closing and self._task is None:
            fut.set_exception(RuntimeError("state writer closed"))
            return fut
        if meanwhile is not None:
            self._meanwhile[fut] = meanwhile
        self._queue.append((write, fut, time.monotonic(), linger))
        self._wake.set()
        if not linger:
            self._waited.set()
        return fut

    async def close(self) -> None:
        """Flush what is queued, then stop."""
        self._closing = True
        self._wake.set()
        self._waited.set()
        if self._task is not None:
            await self._task
            self._task = self._loop_of = None
        await self._commits.close()

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            if not self._queue:  # taken by the last round already
                if self._closing:
                    return
                self._wake.clear()
                continue
            if not self._waited.is_set() and not self._closing:
                # nobody waits for what is queued: until somebody does, or its oldest is due
                first = min(queued for _, _, queued, _ in self._queue)
                await woken(self._waited, max(first + LINGER_S - time.monotonic(), 0.0))
            # one turn of the loop before taking the queue: the tasks made ready with the
            # first write (a swarm's start and its first wave's write-ahead, the synthesizer's
            # status and its attempt) write too, and go in the same commit, not the next
            await asyncio.sleep(0)
            self._wake.clear()
            self._waited.clear()
            while batch := self._take():
                for at in range(0, len(batch), self._max_batch):
                    await self._commit(batch[at:at + self._max_batch])
            if self._queue:  # young lingering writes held back: wait again, for them
                self._wake.set()
            elif self._closing:
                return

    def _take(self) -> list[Pending]:
        """The queued writes of every swarm that has one due (awaited, or lingering for
        HOLD_S or more; all when closing), in order; the other swarms' stay queued."""
        queue, now = self._queue, time.monotonic()
        due = None if self._closing else {w.swarm_id for w, _, queued, linger in queue
                                          if not linger or now - queued >= HOLD_S}
        self._queue = [] if due is None else [q for q in queue if q[0].swarm_id not in due]
        return [(w, f) for w, f, _, _ in queue if due is None or w.swarm_id in due]

    async def transact(self, op: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """One transaction of its own (not group-committed), retried like the batches."""
        return await in_transaction(self._sessions, op, retry_for_s=self._retry_for_s)

    async def _apply(self, writes: list[SwarmWrite]) -> set[str]:
        # a database restart or outage is retried until the lease would have expired
        # anyway; the batch is idempotent (inserts ignore rows already there, the ledger
        # settles only unsettled rows), so a retry after a COMMIT whose outcome was lost
        # duplicates nothing
        return await self._commits.apply(writes)

    async def _commit(self, batch: list[Pending]) -> None:
        try:
            fenced = await self._applied([w for w, _ in batch], [
                self._meanwhile.pop(f) for _, f in batch if f in self._meanwhile])
        except Exception as exc:
            if database_unavailable(exc):
                await self._unavailable(batch, exc)
                return
            # one swarm's rows must not fail the others': retry each swarm alone, then each
            # write of a swarm that still fails alone
            swarms: dict[str, list[Pending]] = {}
            for p in batch:
                swarms.setdefault(p[0].swarm_id, []).append(p)
            log.warning("group commit of %d writes (%d swarms) refused (%s); retrying per swarm",
                        len(batch), len(swarms), _reason(exc))
            for pending in swarms.values():
                await self._commit_alone(pending, whole=len(swarms) > 1)
            return
        self._resolve(batch, fenced)

    async def _applied(self, writes: list[SwarmWrite], meanwhile: list[Callable[[], None]]
                       ) -> set[str]:
        """`_apply`, with the work asked to run meanwhile done once its statement is sent
        (`aio.alongside`); that work's errors are logged, the write commits regardless."""
        if not meanwhile:
            return await self._apply(writes)

        def work() -> None:
            for each in meanwhile:
                try:
                    each()
                except Exception:  # the write is not its business
                    log.exception("work done while a commit ran failed")

        fenced, _ = await alongside(self._apply(writes), work)
        return fenced

    async def _commit_alone(self, pending: list[Pending], whole: bool) -> None:
        if whole:
            try:
                self._resolve(pending, await self._apply([w for w, _ in pending]))
                return
            except Exception as exc:
                if database_unavailable(exc):
                    await self._unavailable(pending, exc)
                    return
        for p in pending:
            try:
                self._resolve([p], await self._apply([p[0]]))
            except Exception as exc:
                if database_unavailable(exc):
                    await self._unavailable([p], exc)
                else:
                    await self._salvage(p, exc)

    async def _salvage(self, p: Pending, exc: Exception) -> None:
        """A write refused on its own: keep its money, reject the rest to its runner."""
        write, fut = p
        reason = _reason(exc)
        try:
            kept = await self.transact(lambda session: spend_only(
                session, self._owner, write, lease_s=self._retry_for_s))
        except Exception as again:
            log.error("swarm %s: even the spend of a refused write failed: %s", write.swarm_id,
                      _reason(again))
            self._lost([p], again)
            return
        self._told(write, kept)
        log.error("swarm %s: write refused by the database (%s); its %d ledger rows kept",
                  write.swarm_id, reason, len(write.ledger))
        if not fut.done():
            # the stored error names the kind of refusal only: a driver's message may quote
            # the refused value (the output), and the reason is in the log
            kind = type(getattr(exc, "orig", None) or exc).__name__
            fut.set_exception(WriteRejected(kind) if kept else LeaseLost(write.swarm_id))
        if kept and self._on_commit is not None:
            self._on_commit(write.swarm_id, None)  # its money only, not its status

    async def _unavailable(self, batch: list[Pending], exc: Exception) -> None:
        """The database could not take `batch` within the retry window (down, or SQLite's
        write lock held by another connection): the writes of swarms this process still
        drives are tried again, window after window, until they commit or are fenced out
        (the heartbeat found the lease lost, and stopped the runner); the others are lost.
        A write with ledger rows, totals or reservations in it is never dropped while its
        owner holds the lease: a takeover settles what the loser had in flight."""
        while True:
            kept = self._still_held(batch)
            ids = {id(p) for p in kept}
            self._lost([p for p in batch if id(p) not in ids], exc)
            if not kept:
                return
            log.warning("state write of %d swarms: database unavailable for over %.3g s (%s);"
                        " retrying while their leases are held", len({w.swarm_id for w, _ in kept}),
                        self._retry_for_s, _reason(exc))
            batch = kept
            try:
                fenced = await self._apply([w for w, _ in batch])
            except Exception as again:
                if not database_unavailable(again):
                    await self._commit_alone(batch, whole=False)
                    return
                exc = again
                continue
            self._resolve(batch, fenced)
            return

    def _still_held(self, batch: list[Pending]) -> list[Pending]:
        if self._holding is None or self._closing:
            return []
        holding = self._holding
        return [p for p in batch if not p[1].done() and holding(p[0].swarm_id)]

    def _lost(self, batch: list[Pending], exc: Exception) -> None:
        if not batch:
            return
        log.error("state write failed for good: %s", _reason(exc),
                  exc_info=not database_unavailable(exc))
        for write, fut in batch:
            self._told(write, False)
            if not fut.done():
                fut.set_exception(LeaseLost(f"state write failed: {_reason(exc)}"))

    def _told(self, write: SwarmWrite, stored: bool) -> None:
        if write.settles and self._on_settled is not None:
            try:
                self._on_settled(write.settles, stored)
            except Exception:  # the caps' bookkeeping, not the commit's: the loop goes on
                log.exception("tenant cap settlements of swarm %s: telling their caps failed",
                              write.swarm_id)

    def _resolve(self, batch: list[Pending], fenced: set[str]) -> None:
        for write, fut in batch:
            # a future its waiter cancelled is done: the write was committed all the same
            self._told(write, write.swarm_id not in fenced)
            if fut.done():
                continue
            if write.swarm_id in fenced:
                fut.set_exception(LeaseLost(write.swarm_id))
            else:
                fut.set_result(None)
        if self._on_commit is not None:
            status = {w.swarm_id: w.swarm.get("status") for w, _ in batch}  # the last write's
            for swarm_id in status.keys() - fenced:
                self._on_commit(swarm_id, status[swarm_id])


def _reason(exc: BaseException) -> str:
    """The first line of an error, short, storable, without the SQL and without the long
    quoted values a driver echoes (a refused output, a prompt)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    first = _QUOTED.sub("'…'", first)
    return storable(f"{type(exc).__name__}: {first}"[:300])[0]


_QUOTED = re.compile(r"'[^']{24,}(?:'|$)")


def retrieve_exception(fut: asyncio.Future[None]) -> None:
    """Done-callback for writes nobody awaits: mark their exception retrieved."""
    if not fut.cancelled():
        fut.exception()
