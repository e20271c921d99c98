"""Workers' tokens as they come (SPEC §10 token streaming): held by nobody, handed to whoever
reads the swarm now — in this process directly, in the others through PostgreSQL NOTIFY.

A delta is not stored: a reader that was not there does not get it (the subtask's
`subtask.succeeded` has the whole output). The owner of a swarm NOTIFYs every delta on the
`swarm_delta` channel, in order, from one connection of its own (NOTIFYs of one session arrive in
the order sent); each process LISTENing hands them to its readers and skips its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterator
from typing import NamedTuple

import pydantic_core

from app.aio import cancel_and_wait
from app.db.dialect import NotifySender

log = logging.getLogger(__name__)

CHANNEL = "swarm_delta"
# a NOTIFY payload holds under 8,000 bytes: a piece of 1,000 characters is at most 6,000 as
# JSON (every character escaped), with room for the swarm id, the name and the origin
PIECE_CHARS = 1000


class Delta(NamedTuple):
    name: str
    text: str


class DeltaHub:
    """Readers of swarms' deltas in this process, and (PostgreSQL) the sender to the others."""

    def __init__(self) -> None:
        self.origin = uuid.uuid4().hex[:12]  # this process: its own NOTIFYs come back to it
        self._readers: dict[str, set[asyncio.Queue[Delta]]] = {}
        self._notify: NotifySender | None = None
        self._outbox: asyncio.Queue[str] | None = None
        self._sender: asyncio.Task[None] | None = None

    def send_to(self, sender: NotifySender) -> None:
        """Publish this process's deltas to the others through `sender` (on CHANNEL)."""
        self._notify = sender

    async def close(self) -> None:
        if self._sender is not None:
            await cancel_and_wait(self._sender)
            self._sender = None
        if self._notify is not None:
            await self._notify.close()

    @contextlib.contextmanager
    def reading(self, swarm_id: str) -> Iterator[asyncio.Queue[Delta]]:
        """A queue of the swarm's deltas from now on, until the block ends."""
        queue: asyncio.Queue[Delta] = asyncio.Queue()
        self._readers.setdefault(swarm_id, set()).add(queue)
        try:
            yield queue
        finally:
            readers = self._readers.get(swarm_id)
            if readers is not None:
                readers.discard(queue)
                if not readers:
                    del self._readers[swarm_id]

    def publish(self, swarm_id: str, name: str, text: str) -> None:
        """A worker's new text: to this process's readers now, to the others' soon."""
        self._deliver(swarm_id, Delta(name, text))
        if self._notify is None:
            return
        if self._outbox is None:
            self._outbox = asyncio.Queue()
            self._sender = asyncio.create_task(self._send(), name="delta sender")
        for i in range(0, len(text), PIECE_CHARS):
            self._outbox.put_nowait(pydantic_core.to_json(
                [self.origin, swarm_id, name, text[i:i + PIECE_CHARS]]).decode())

    def received(self, payload: str) -> None:
        """A `swarm_delta` notification (the ChangeListener's handler)."""
        try:
            origin, swarm_id, name, text = pydantic_core.from_json(payload)
        except (ValueError, TypeError):
            return
        if origin != self.origin and isinstance(text, str):
            self._deliver(str(swarm_id), Delta(str(name), text))

    def _deliver(self, swarm_id: str, delta: Delta) -> None:
        for queue in self._readers.get(swarm_id, ()):
            queue.put_nowait(delta)

    async def _send(self) -> None:
        """Drain the outbox: what queued while the last statement ran goes in the next one.
        Deltas lost to a broken connection are lost (the outputs are whole in the events)."""
        assert self._outbox is not None and self._notify is not None
        outbox, sender = self._outbox, self._notify
        while True:
            batch = [await outbox.get()]
            while not outbox.empty():
                batch.append(outbox.get_nowait())
            try:
                await sender.send(batch)  # a failure closed its connection: a new one next
            except Exception as exc:
                log.warning("token deltas not sent to other processes (%s)", exc)
                await asyncio.sleep(0.5)  # a database away is not asked again at once
