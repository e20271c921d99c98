"""In-process wake-ups for readers of a swarm (`?wait=`, event streams)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import NamedTuple

from app.aio import woken
from app.db.tables import Subtask, Swarm
from app.engine.deltas import DeltaHub
from app.states import SwarmStatus

_STATUSES = {s.value: s for s in SwarmStatus}
EndedRows = tuple[Swarm, Sequence[Subtask]]
# a swarm's rows as a reader's answer (the API's `views.swarm_json`, which the engine may
# not import: the API hands it to the notifier)
Render = Callable[[Swarm, Iterable[Subtask]], bytes]


class Ended(NamedTuple):
    """What `until_ended` saw: the status (None: not found), and the rows the runner that
    ended the swarm in this process offered (`SwarmNotifier.ended`), when it did, with their
    answer when the runner built it (`SwarmNotifier.render`)."""

    status: SwarmStatus | None
    rows: EndedRows | None = None
    answer: bytes | None = None


class Change(asyncio.Event):
    """An armed wake-up, and what the changes that set it said of the swarm's status since
    it was last `take()`n: the terminal status one of them ended it in, whether one did not
    say."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: SwarmStatus | None = None
        self.unsaid = False
        self.rows: EndedRows | None = None  # the ended swarm's rows, from its runner
        self.answer: bytes | None = None  # ... rendered, when its runner did

    def take(self) -> tuple[SwarmStatus | None, bool]:
        """(ended, unsaid) since the last take; clears them and the event."""
        seen = self.ended, self.unsaid
        self.ended, self.unsaid = None, False
        self.clear()
        return seen


class SwarmNotifier:
    """Wakes coroutines waiting on a swarm when it changed: on commits of this process's
    engine, and (PostgreSQL) on `swarm_changed` notifications from other processes (payload:
    the swarm id and its status after the commit).

    A reader `arm()`s before it reads and waits on the event it got, so a change committed
    between its read and its wait still wakes it; the event stays armed (set again by every
    change) until the reader `disarm()`s it, so a reader that clears it (`Change.take`) misses
    no change either.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, set[Change]] = {}
        # whether this process's engine runs the swarm (its Scheduler says): that runner offers
        # its rows (`ended`) in the turn its writer says the end is committed
        self.runs_here: Callable[[str], bool] = lambda _swarm_id: False
        # whether the server is shutting down (the API layer says): a wait then ends at its
        # next wake-up with the state as it is, answered before the server's hard cut
        self.stopping: Callable[[], bool] = lambda: False
        # how a reader answers with a swarm's rows (the API says): an ended swarm's runner
        # builds the answer while its end commits, for the readers waiting then (`render`)
        self.renderer: Render | None = None
        self.deltas = DeltaHub()  # workers' tokens, to the readers that asked (SPEC §10)

    def notify(self, swarm_id: str, status: str | None = None) -> None:
        """The swarm changed; `status` is its status after the change, when known."""
        waiting = self._waiters.get(swarm_id)
        if not waiting:
            return
        said = _STATUSES.get(status) if status is not None else None
        ended = said if said is not None and said.terminal else None
        for ev in waiting:
            ev.ended = ev.ended or ended
            ev.unsaid |= said is None
            ev.set()

    def notify_all(self) -> None:
        """Changes may have gone unheard (a LISTEN reconnect): every waiting reader re-reads."""
        for swarm_id in list(self._waiters):
            self.notify(swarm_id)

    def render(self, swarm_id: str, swarm: Swarm, subtasks: Iterable[Subtask]) -> bytes | None:
        """The swarm's answer from its rows, when a reader waits on it (None: nobody does, or
        the API set no renderer). Its runner asks while its end commits: the answer's CPU is
        spent while the database works, not after it answered, and the reader is answered at
        the commit."""
        if self.renderer is None or not self._waiters.get(swarm_id):
            return None
        return self.renderer(swarm, subtasks)

    def ended(self, swarm_id: str, swarm: Swarm, subtasks: Sequence[Subtask],
              answer: bytes | None = None) -> None:
        """The runner that ended the swarm, once its end is committed, offers its rows (its
        in-memory state, which the commit wrote) and their `answer` when it built one
        (`render`): a reader waiting for the end answers from them instead of reading the
        swarm back (the read is a large part of a wide swarm's answer). Nothing is kept when
        nobody waits. It wakes them too: the writer's notify of the same commit may have woken
        a waiter a turn before."""
        ended = SwarmStatus(swarm.status)
        for ev in self._waiters.get(swarm_id, ()):
            ev.rows = (swarm, subtasks)
            ev.answer = answer
            ev.ended = ev.ended or ended
            ev.set()

    def notified(self, payload: str) -> None:
        """A `swarm_changed` notification: "<swarm id> <status>" (a bare id: status unsaid)."""
        swarm_id, _, status = payload.partition(" ")
        self.notify(swarm_id, status or None)

    def arm(self, swarm_id: str) -> Change:
        """An event the next change of this swarm sets (and every later one, until disarmed)."""
        ev = Change()
        self._waiters.setdefault(swarm_id, set()).add(ev)
        return ev

    def disarm(self, swarm_id: str, event: Change) -> None:
        """Forget an armed event nobody will wait on (a reader that ended)."""
        waiting = self._waiters.get(swarm_id)
        if waiting is not None:
            waiting.discard(event)
            if not waiting:
                del self._waiters[swarm_id]

    async def until_ended(self, swarm_id: str, deadline: float,
                          read_status: Callable[[], Awaitable[SwarmStatus | None]],
                          fallback_s: float) -> Ended:
        """Wait until the swarm is terminal or the monotonic `deadline` passes; returns the
        status last read or said (None: not found), with the rows its runner offered if it
        ended in this process (`ended`). Woken by every commit of the swarm, each
        saying its status after it committed, the database is asked (`read_status`) only when
        one did not say, or after `fallback_s` without a wake-up (a lost notification): re-read
        on every wake-up, a 20-agent swarm's waiter had read it 30 times. A terminal status
        said is final (nothing moves a swarm out of one): it is answered without a read."""
        armed = self.arm(swarm_id)  # before the first look: no change missed
        try:
            status = await read_status()
            while (status is not None and not status.terminal
                   and (left := deadline - time.monotonic()) > 0 and not self.stopping()):
                fired = await woken(armed, min(left, fallback_s))
                ended, unsaid = armed.take()
                # an end heard first from another connection (LISTEN: PostgreSQL tells every
                # listener at the commit, maybe before this process's own commit returned)
                # of a swarm run here waits for its runner's rows, a turn or a round trip away
                if ended is not None and (armed.rows is not None
                                          or not self.runs_here(swarm_id)):
                    return Ended(ended, armed.rows, armed.answer)
                if ended is None and (not fired or unsaid):
                    status = await read_status()
            # a runner that ended it here during a read offered its rows: the read saw its end
            if status is not None and status.terminal:
                return Ended(status, armed.rows, armed.answer)
            return Ended(status)
        finally:
            self.disarm(swarm_id, armed)

    async def wait(self, swarm_id: str, timeout: float) -> bool:
        """Return when the swarm changes (True) or after `timeout` seconds (False)."""
        ev = self.arm(swarm_id)
        try:
            return await woken(ev, timeout)
        finally:
            self.disarm(swarm_id, ev)
