"""Following a swarm's events table: the one reader behind `GET /swarms/{id}/events` and the
facade's streams, so a stream works whichever process runs the swarm."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from app.db import queries
from app.db.session import SessionFactory
from app.db.tables import Event
from app.engine.notify import SwarmNotifier
from app.states import SwarmStatus

POLL_S = 0.5  # how often readers re-read when the change happens in another process


async def follow_events(sessions: SessionFactory, notifier: SwarmNotifier, swarm_id: str,
                        tenant: str | None, after: int = 0) -> AsyncIterator[Event]:
    """The swarm's events after seq `after`, as they are committed; ends after
    `swarm.completed` (or when the swarm is terminal or gone and nothing is left to read)."""
    seq = after
    while True:
        async with sessions() as s, s.begin():
            # status first: the terminal status commits with `swarm.completed`, so a reader
            # resuming at or past that event gets an ended stream, not one held open forever
            status = await queries.get_status(s, swarm_id, tenant)
            ended = status is None or SwarmStatus(status).terminal
            rows = await queries.events_after(s, swarm_id, seq)
        for ev in rows:
            seq = ev.seq
            yield ev
            if ev.type == "swarm.completed":
                return
        if not rows:
            if ended:
                return
            await notifier.wait(swarm_id, POLL_S)
        else:
            await asyncio.sleep(0)
