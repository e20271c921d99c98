"""Following a swarm's events table: the one reader behind `GET /swarms/{id}/events` and the
facade's streams, so a stream works whichever process runs the swarm."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

from app.aio import cancel_and_wait, woken
from app.db import queries
from app.db.session import SessionFactory
from app.db.tables import Event
from app.engine.deltas import Delta
from app.engine.waiters import SwarmNotifier

# the OpenAI facade's swarm answers (app/api/openai_swarm.py) re-read the status this often
# without a wake-up
POLL_S = 0.5
# readers are woken by commits (this process's engine, or NOTIFY from others); without a
# wake-up they re-read this often, in case a notification was lost (a LISTEN reconnect)
FALLBACK_S = 2.0
# a number missing while later ones are committed: a result the database refused fails its
# subtask under its event's number (`steps.refused_result`), committed after the events
# numbered past it. Readers hand events out in order once it is, or skip it after this long
# (a gap an earlier version left)
HOLE_S = 1.0


async def follow_events(sessions: SessionFactory, notifier: SwarmNotifier, swarm_id: str,
                        tenant: str | None, after: int = 0) -> AsyncGenerator[Event, None]:
    """The swarm's events after seq `after`, as they are committed; ends after
    `swarm.completed` (or when the swarm is terminal or gone and nothing is left to read).

    Driven by the events table: read what is new, hand it out, sleep until a commit of this
    swarm wakes us (armed before the read, so none is missed). The swarm's status is read only
    on the first read and after a wait that no wake-up ended: a resume at or past
    `swarm.completed` (the terminal status commits with it), or a lost notification. It is
    read *before* the events: on PostgreSQL each statement sees what was committed before it
    began, so events read after a terminal status include `swarm.completed`; read the other
    way round, the completion could commit between the two and end the stream without it.
    Events are handed out in order: past a missing number only after it came (or HOLE_S)."""
    seq, check_status = after, True
    hole_until: float | None = None  # when a missing number is given up on
    loop = asyncio.get_running_loop()
    armed = notifier.arm(swarm_id)
    try:
        while True:
            async with sessions() as s, s.begin():
                status = (await queries.get_status(s, swarm_id, tenant)
                          if check_status else None)
                rows = await queries.events_after(s, swarm_id, seq)
            n = 0  # how many follow on without a missing number
            while n < len(rows) and rows[n].seq == seq + 1 + n:
                n += 1
            if n == len(rows):
                hole_until = None
            elif hole_until is None:
                hole_until = loop.time() + HOLE_S
            elif loop.time() >= hole_until:  # never filled
                n, hole_until = len(rows), None
            for ev in rows[:n]:
                seq = ev.seq
                yield ev
                if ev.type == "swarm.completed":
                    return
            if hole_until is not None:  # wait for the missing number's commit
                await woken(armed, max(hole_until - loop.time(), 0.0))
                notifier.disarm(swarm_id, armed)
                armed = notifier.arm(swarm_id)
                continue
            if rows:
                await asyncio.sleep(0)
                continue
            if check_status and (status is None or status.terminal):
                return
            check_status = not await woken(armed, FALLBACK_S)
            notifier.disarm(swarm_id, armed)
            armed = notifier.arm(swarm_id)
    finally:
        notifier.disarm(swarm_id, armed)


async def follow_with_deltas(sessions: SessionFactory, notifier: SwarmNotifier, swarm_id: str,
                             tenant: str | None, after: int = 0
                             ) -> AsyncIterator[Event | Delta]:
    """`follow_events`, and the workers' tokens as they come between them (SPEC §10). Deltas
    waiting when an event is read go out before it: a subtask's text before its end."""
    with notifier.deltas.reading(swarm_id) as deltas:
        events = follow_events(sessions, notifier, swarm_id, tenant, after)
        next_event: asyncio.Task[Event] = asyncio.ensure_future(anext(events))
        next_delta: asyncio.Task[Delta] = asyncio.ensure_future(deltas.get())
        try:
            while True:
                await asyncio.wait((next_event, next_delta),
                                   return_when=asyncio.FIRST_COMPLETED)
                if next_delta.done():
                    yield next_delta.result()
                    next_delta = asyncio.ensure_future(deltas.get())
                    continue
                try:
                    ev = next_event.result()
                except StopAsyncIteration:
                    return
                while not deltas.empty():
                    yield deltas.get_nowait()
                yield ev
                next_event = asyncio.ensure_future(anext(events))
        finally:
            for task in (next_delta, next_event):
                if not task.done():
                    await cancel_and_wait(task)
                elif not task.cancelled():
                    task.exception()  # seen: the end of the events, or what ended them
            await events.aclose()
