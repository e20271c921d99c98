"""In-process wake-ups for readers of a swarm (`?wait=`, event streams)."""

from __future__ import annotations

import asyncio
import contextlib


class SwarmNotifier:
    """Wakes coroutines waiting on a swarm when this process changed it.

    Other processes' changes are seen by polling; this only shortens the wait when the
    engine runs in the same process as the API.
    """

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def notify(self, swarm_id: str) -> None:
        ev = self._events.pop(swarm_id, None)
        if ev is not None:
            ev.set()

    async def wait(self, swarm_id: str, timeout: float) -> None:
        """Return when the swarm changes here or after `timeout` seconds."""
        ev = self._events.setdefault(swarm_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout)
