"""Several sessions with one streamable-HTTP server, each call on the least busy one.

One SDK session is one client dispatcher and one server-side session, each a single task's
loop, so many calls at once queue behind one session's loops (docs/decisions/
0020-mcp-session-pool.md). A pool holds up to `size` call sessions (SWARM_MCP_HTTP_SESSIONS)
beside the connection's own, which lists tools and watches the server: one is opened when a
call finds every open session busy, a call that fails takes its session out of the choice
until a ping answers, and a session whose ping fails is closed and later replaced (while none
opens, calls use the listing session, as without a pool). The registry's limits (slots,
timeouts, caps) hold per call around the lease, whatever session serves it; a session carries
no tenant's state (its headers are the server's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress

from mcp import ClientSession
from mcp.client.session import IncomingMessage

from app.aio import wait_for, woken
from app.tools.config import ServerConfig
from app.tools.model import ServerUnavailable
from app.tools.transports import describe, open_session

log = logging.getLogger(__name__)

PING_INTERVAL_S = 1.0
PING_TIMEOUT_S = 10.0


class Liveness:
    """When a session's watcher pings its server: every PING_INTERVAL_S, at once when poked (a
    call failed, the transport erred, the tools changed), and not while calls on the session
    are answered: an answer within the interval says what a ping would."""

    def __init__(self) -> None:
        self.poke = asyncio.Event()
        self._answered = -PING_INTERVAL_S  # monotonic

    def answered(self) -> None:
        self._answered = time.monotonic()

    async def due(self) -> bool:
        """Wait for the next ping's turn: False when the session answered a call since."""
        poked = await woken(self.poke, PING_INTERVAL_S)
        self.poke.clear()
        return poked or time.monotonic() - self._answered >= PING_INTERVAL_S


class _Member:
    """One call session, owned by its task from opening to closing."""

    def __init__(self, pool: SessionPool) -> None:
        self.pool = pool
        self.session: ClientSession | None = None
        self.busy = 0  # calls in flight on it
        self.suspect = False  # a call on it failed: chosen again once a ping answers
        self.error: str | None = None
        self.opened = asyncio.Event()  # set once open or failed to open
        self.live = Liveness()
        self.task = asyncio.create_task(self._run(), name=f"mcp-{pool.name}-session")

    @property
    def usable(self) -> bool:
        return self.session is not None and not self.suspect

    def check(self) -> None:
        """Ping now (a call on this session failed)."""
        self.suspect = True
        self.live.poke.set()

    async def _run(self) -> None:
        try:
            async with AsyncExitStack() as stack:
                self.session = await open_session(stack, self.pool.config, self._on_message)
                self.opened.set()
                self.pool.changed()
                await self._watch(self.session)
        except Exception as exc:  # the session is gone; the pool opens another on demand
            self.error = describe(exc)
            log.info("MCP server %s: a call session closed: %s", self.pool.name, self.error)
        finally:
            self.session = None
            self.opened.set()
            self.pool.discard(self)

    async def _watch(self, session: ClientSession) -> None:
        stop = self.pool.stopping
        while not stop.is_set():
            if not await self.live.due():
                continue
            if stop.is_set():
                return
            await wait_for(session.send_ping(), PING_TIMEOUT_S)
            if self.suspect:
                self.suspect = False
                self.pool.changed()

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, Exception):  # the transport failed: ping now
            self.live.poke.set()


class SessionPool:
    """Up to `size` call sessions with the server of `config`, opened as calls need them."""

    def __init__(self, name: str, config: ServerConfig, size: int) -> None:
        if size < 1:
            raise ValueError("a session pool needs at least one session")
        self.name = name
        self.config = config
        self.size = size
        self.stopping = asyncio.Event()
        self._members: list[_Member] = []
        self._changed = asyncio.Event()

    @property
    def open_sessions(self) -> int:
        return sum(1 for m in self._members if m.session is not None)

    def changed(self) -> None:
        self._changed.set()

    def discard(self, member: _Member) -> None:
        with suppress(ValueError):
            self._members.remove(member)
        self.changed()

    @asynccontextmanager
    async def lease(self, fallback: ClientSession) -> AsyncIterator[ClientSession]:
        """The least busy usable session for one call (`fallback`, the listing session, when
        none can be opened); a failure inside marks a pooled session suspect."""
        member = await self._pick()
        session = member.session if member is not None else None
        if member is None or session is None:  # none opens, or it closed since its choice
            yield fallback
            return
        member.busy += 1
        try:
            yield session
        except Exception:
            member.check()
            raise
        else:
            member.live.answered()
        finally:
            member.busy -= 1

    async def _pick(self) -> _Member | None:
        while True:
            if self.stopping.is_set():
                raise ServerUnavailable(f"server {self.name} is stopping")
            self._changed.clear()
            best = min((m for m in self._members if m.usable), key=lambda m: m.busy,
                       default=None)
            if (best is None or best.busy > 0) and len(self._members) < self.size:
                member = _Member(self)
                self._members.append(member)
                if best is None:  # nothing open to use meanwhile: wait for this one
                    await member.opened.wait()
                    return member if member.session is not None else None
            if best is not None:
                return best
            await self._changed.wait()  # every session is opening or suspect

    async def stop(self) -> None:
        """Close every session (each in its own task, as it was opened)."""
        self.stopping.set()
        members = list(self._members)
        for m in members:
            m.check()
        if members:
            _, pending = await asyncio.wait([m.task for m in members], timeout=10)
            for task in pending:
                task.cancel()
