"""One MCP server per process: connect (stdio or streamable HTTP), list its tools, keep it up.

Each `ServerConnection` owns a supervisor task that enters the SDK's transport and
`ClientSession` context managers (anyio wants them entered and left in one task), pings the
server, re-lists its tools when it says they changed, and reconnects with backoff when it dies
(a stdio server is started again). A server that cannot start is logged and `down`; nothing
else fails with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import mcp_types as types
from mcp import ClientSession
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPError

from app.aio import wait_for, woken
from app.tools.config import ServerConfig
from app.tools.model import ServerUnavailable, ToolInfo
from app.tools.pool import Liveness, SessionPool
from app.tools.transports import describe, open_session

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 10.0  # a dead process fails at once; this bounds a hung one
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
# a server that was up this recently and is down now is restarting: a swarm naming it is
# accepted (its calls wait for the restart within their timeout); down longer, it is gone
RESTARTING_S = 60.0


class ServerConnection:
    """The session with one server, restarted whenever it dies; `state` is starting|up|down."""

    def __init__(self, name: str, config: ServerConfig, http_sessions: int = 1) -> None:
        self.name = name
        self.config = config
        # calls to a streamable-HTTP server spread over a pool of sessions beside this one
        # (which lists tools and watches the server); a stdio server's calls share its one
        # session, which the SDK pipelines (requests matched to answers by JSON-RPC id)
        self.pool = (SessionPool(name, config, http_sessions)
                     if config.url is not None and http_sessions > 1 else None)
        self.state = "starting"
        self.error: str | None = None
        self.restarts = 0
        self.down_since: float | None = None  # monotonic; None while up or never up
        self.tools: dict[str, ToolInfo] = {}  # the last listing, kept while down
        self._session: ClientSession | None = None
        self._up = asyncio.Event()
        self._tried = asyncio.Event()  # the first connection attempt ended (either way)
        self.live = Liveness()  # poked: re-list tools or check the connection now
        self._relist = False
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"mcp-{self.name}")

    async def first_attempt(self, timeout_s: float) -> None:
        await woken(self._tried, timeout_s)

    async def stop(self) -> None:
        self._stop.set()
        self.live.poke.set()
        if self.pool is not None:
            await self.pool.stop()
        if self._task is not None:
            try:
                await wait_for(self._task, 10)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()

    async def session(self, wait_s: float) -> ClientSession:
        """The live session, waiting up to `wait_s` for a (re)start."""
        if self._session is None:
            try:
                await wait_for(self._up.wait(), wait_s)
            except TimeoutError:
                raise ServerUnavailable(f"server {self.name} is {self.state}"
                                        + (f": {self.error}" if self.error else "")) from None
        if self._session is None:  # woke for a session that died at once
            raise ServerUnavailable(f"server {self.name} is {self.state}")
        return self._session

    @asynccontextmanager
    async def lease(self, wait_s: float) -> AsyncIterator[ClientSession]:
        """A session for one call, once the server is up (waiting up to `wait_s`); a failure
        below the protocol has the session checked now, not at the next ping."""
        session = await self.session(wait_s)
        if self.pool is not None:
            async with self.pool.lease(session) as pooled:
                yield pooled
            return
        try:
            yield session
        except MCPError:  # the server answered, or the SDK saw the connection close: the
            raise  # session is not suspect, and the next ping tells which
        except Exception:
            self.suspect()
            raise
        else:
            self.live.answered()

    @property
    def restarting(self) -> bool:
        """Down now after having been up, within RESTARTING_S."""
        return (self.state != "up" and self.down_since is not None
                and time.monotonic() - self.down_since < RESTARTING_S)

    def suspect(self) -> None:
        """A call failed below the protocol: check the connection now, not at the next ping."""
        self.live.poke.set()

    # ---- the supervisor ------------------------------------------------------------------

    async def _supervise(self) -> None:
        delay = BACKOFF_FIRST_S
        while not self._stop.is_set():
            try:
                await self._serve()
                delay = BACKOFF_FIRST_S
            except Exception as exc:  # any failure of the server: logged, retried
                self.error = describe(exc)
                log.warning("MCP server %s is down: %s", self.name, self.error)
            finally:
                if self.state == "up":
                    self.down_since = time.monotonic()
                self._session = None
                self._up.clear()
                self.state = "down"
                self._tried.set()
            if self._stop.is_set():
                break
            self.restarts += 1
            await woken(self._stop, delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _serve(self) -> None:
        async with AsyncExitStack() as stack:
            session = await open_session(stack, self.config, self._on_message)
            await self._list_tools(session)
            self._session, self.state, self.error = session, "up", None
            self.down_since = None
            self._up.set()
            self._tried.set()
            log.info("MCP server %s is up with %d tools", self.name, len(self.tools))
            await self._watch(session)

    async def _watch(self, session: ClientSession) -> None:
        """Until stopped: ping (a dead server raises here) and re-list tools on change."""
        while not self._stop.is_set():
            if not await self.live.due():
                continue
            if self._stop.is_set():
                return
            await wait_for(session.send_ping(), PING_TIMEOUT_S)
            if self._relist:
                self._relist = False
                await self._list_tools(session)

    async def _list_tools(self, session: ClientSession) -> None:
        tools: dict[str, ToolInfo] = {}
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await wait_for(session.list_tools(params=params), self.config.timeout_s)
            for t in page.tools:
                tools[t.name] = ToolInfo(self.name, t.name, t.description or "",
                                         dict(t.input_schema))
            cursor = page.next_cursor
            if not cursor:
                break
        self.tools = tools

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._relist = True
        self.live.poke.set()  # a transport exception too: ping now

