"""In-process wake-ups for readers of a swarm (`?wait=`, event streams)."""

from __future__ import annotations

import asyncio
import contextlib


class SwarmNotifier:
    """Wakes coroutines waiting on a swarm when it changed: on commits of this process's
    engine, and (PostgreSQL) on `swarm_changed` notifications from other processes.

    A reader `arm()`s before it reads and waits on the event it got, so a change committed
    between its read and its wait still wakes it; it `disarm()`s when it stops reading.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}

    def notify(self, swarm_id: str) -> None:
        for ev in self._waiters.pop(swarm_id, ()):
            ev.set()

    def arm(self, swarm_id: str) -> asyncio.Event:
        """An event the next change of this swarm sets (once)."""
        ev = asyncio.Event()
        self._waiters.setdefault(swarm_id, set()).add(ev)
        return ev

    def disarm(self, swarm_id: str, event: asyncio.Event) -> None:
        """Forget an armed event nobody will wait on (a reader that ended)."""
        waiting = self._waiters.get(swarm_id)
        if waiting is not None:
            waiting.discard(event)
            if not waiting:
                del self._waiters[swarm_id]

    async def wait(self, swarm_id: str, timeout: float) -> bool:
        """Return when the swarm changes (True) or after `timeout` seconds (False)."""
        ev = self.arm(swarm_id)
        try:
            return await woken(ev, timeout)
        finally:
            self.disarm(swarm_id, ev)


async def woken(event: asyncio.Event, timeout: float) -> bool:
    """Wait for an armed event: True when it fired, False after `timeout` seconds."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
        return True
    return False
