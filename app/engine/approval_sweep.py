"""The approval timeout sweep (SPEC §14): every process with an engine looks, once a poll
interval, for swarms awaiting approval past their due time and fails them
`approval_timeout`. Each is ended in a transaction of its own on its locked row, so two
replicas sweeping at once end it once."""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from app.aio import woken
from app.db import approval as repo
from app.db import queries
from app.db.retry import log_db_failure
from app.db.session import SessionFactory, db_now
from app.engine import gate
from app.engine.waiters import SwarmNotifier

log = logging.getLogger(__name__)
BATCH = 100


async def sweep_once(sessions: SessionFactory, notifier: SwarmNotifier | None = None) -> int:
    """End the overdue swarms (up to a batch); how many were ended here."""
    async with sessions() as session, session.begin():
        due = await repo.overdue(session, await db_now(session), BATCH)
    ended = 0
    for swarm_id in due:
        async with sessions() as session, session.begin():
            swarm = await queries.get_swarm(session, swarm_id, None, for_update=True)
            if swarm is None or not await gate.time_out(session, swarm, await db_now(session)):
                continue
        ended += 1
        log.info("swarm %s: approval timed out", swarm_id, extra={"swarm_id": swarm_id})
        if notifier is not None:
            notifier.notify(swarm_id)
    return ended


class ApprovalSweep:
    """`sweep_once` every `interval_s` until stopped."""

    def __init__(self, sessions: SessionFactory, interval_s: float,
                 notifier: SwarmNotifier | None = None) -> None:
        self._sessions, self._interval_s, self._notifier = sessions, interval_s, notifier
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="approval-sweep")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                while await sweep_once(self._sessions, self._notifier) == BATCH:
                    pass  # a full batch: there may be more
            except Exception as exc:
                log_db_failure(log, "approval sweep", exc)
            await woken(self._stop, self._interval_s)
