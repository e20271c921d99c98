"""The tool servers of a process: selection checks, the catalogue, and the limited call."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram

from app import metrics
from app.states import ToolCallStatus
from app.text import storable
from app.tools.arguments import ArgumentsRefused, check_sendable, cleaned_arguments
from app.tools.config import ServerConfig, load_config
from app.tools.limits import PrioritySemaphore, held
from app.tools.model import ServerUnavailable, ToolInfo, ToolOutcome

if TYPE_CHECKING:  # the SDK is imported when a registry is built, not with this module
    import mcp_types as types

    from app.tools.sessions import ServerConnection

log = logging.getLogger(__name__)

UNKNOWN_TOOL_LABEL = "unknown"


class ToolSelectionError(ValueError):
    """A selector names no configured server or listed tool (`code` says which)."""

    def __init__(self, code: str, message: str, selector: str) -> None:
        super().__init__(message)
        self.code = code
        self.selector = selector


def split_selector(selector: str) -> tuple[str, str | None]:
    """`server` -> (server, None); `server.tool` -> (server, tool)."""
    server, dot, tool = selector.partition(".")
    return server, (tool if dot else None)


def permitted(selector: str, allowed: Sequence[str] | None) -> bool:
    """Whether a tenant whose `tools` (SPEC §8) are `allowed` may use `selector`: a server
    listed whole, or the very tool listed (a whole server needs the server listed)."""
    if allowed is None:
        return True
    server, tool = split_selector(selector)
    return server in allowed or (tool is not None and selector in allowed)


def cut(text: str, max_bytes: int) -> str:
    """`text` within `max_bytes` of UTF-8, with a visible marker when something was cut."""
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    kept = raw[:max_bytes].decode(errors="ignore")
    return f"{kept}\n[truncated: {len(raw) - len(kept.encode())} of {len(raw)} bytes omitted]"


def result_text(result: types.CallToolResult) -> str:
    """The text content of a result (other blocks named, not inlined)."""
    import mcp_types as types

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type} content]")
    if not parts and result.structured_content is not None:
        parts.append(str(result.structured_content))
    return "\n".join(parts)


class ToolRegistry:
    """Every configured server of this process, its tools, and the slots that bound them."""

    def __init__(self, servers: dict[str, ServerConfig], *, result_max_bytes: int = 16384,
                 args_max_bytes: int = 262144, start_wait_s: float = 10.0,
                 http_sessions: int = 1) -> None:
        from app.tools.sessions import ServerConnection

        self.connections = {n: ServerConnection(n, c, http_sessions)
                            for n, c in servers.items()}
        self.result_max_bytes = result_max_bytes
        self.args_max_bytes = args_max_bytes
        self._start_wait_s = start_wait_s
        self._server_slots = {n: PrioritySemaphore(c.max_concurrency)
                              for n, c in servers.items()}
        self._tool_slots: dict[tuple[str, str], PrioritySemaphore] = {}
        # each call's metric series, looked up once: prometheus' labels() (a lock, the label
        # values checked and joined) costs more than the update
        self._in_flight: dict[str, Gauge] = {}
        self._series: dict[tuple[str, str, ToolCallStatus], tuple[Counter, Histogram]] = {}

    @classmethod
    def from_file(cls, path: str, *, result_max_bytes: int = 16384,
                  args_max_bytes: int = 262144, http_sessions: int = 1) -> ToolRegistry:
        return cls(load_config(path), result_max_bytes=result_max_bytes,
                   args_max_bytes=args_max_bytes, http_sessions=http_sessions)

    async def start(self) -> None:
        """Start every server and wait (bounded) for each first attempt; a server that does
        not come up stays `down` and keeps being retried."""
        for c in self.connections.values():
            c.start()
        await asyncio.gather(*(c.first_attempt(self._start_wait_s)
                               for c in self.connections.values()))
        for c in self.connections.values():
            metrics.init_tool_labels(c.name, sorted(c.tools))

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in self.connections.values()))

    def states(self) -> dict[str, str]:
        return {n: c.state for n, c in self.connections.items()}

    def catalogue(self) -> list[ToolInfo]:
        """What the servers that are up offer, by server then tool name."""
        return [t for n in sorted(self.connections) if self.connections[n].state == "up"
                for t in sorted(self.connections[n].tools.values(), key=lambda t: t.name)]

    # ---- selection -------------------------------------------------------------------------

    def check(self, selector: str) -> None:
        """Refuse a selector for a swarm being created: unknown server or tool, or a server
        that is down now and not restarting (SPEC §9: one that restarts is waited for)."""
        server, tool = split_selector(selector)
        conn = self.connections.get(server)
        if conn is None:
            raise ToolSelectionError("unknown_tool", f"no tool server {server!r}", selector)
        if conn.state != "up" and not conn.restarting:
            raise ToolSelectionError("tool_server_unavailable",
                                     f"tool server {server!r} is {conn.state}", selector)
        if tool is not None and tool not in conn.tools:
            raise ToolSelectionError("unknown_tool", f"server {server!r} has no tool {tool!r}",
                                     selector)

    def expand(self, selectors: Sequence[str]) -> list[ToolInfo]:
        """The tools an agent may call, from its selectors and the servers' latest listings
        (a server that is down now contributes what it listed last)."""
        out: dict[tuple[str, str], ToolInfo] = {}
        for selector in selectors:
            server, tool = split_selector(selector)
            conn = self.connections.get(server)
            if conn is None:
                continue
            listed = conn.tools.values() if tool is None else (
                [conn.tools[tool]] if tool in conn.tools else [])
            for t in listed:
                out[(t.server, t.name)] = t
        return list(out.values())

    # ---- the call -------------------------------------------------------------------------

    async def call(self, server: str, tool: str, arguments: dict[str, Any],
                   priority: int = 0) -> ToolOutcome:
        """Run one tool within its server's and its own slots (waiters by priority, then
        FIFO) and its server's timeout; every failure becomes an `error: …` outcome, and
        arguments the server cannot be sent fail this call alone, before it takes a slot."""
        conn = self.connections[server]
        try:
            request = check_sendable(tool, cleaned_arguments(arguments))
        except ArgumentsRefused as exc:
            return self._settled(conn, tool, ToolCallStatus.error, str(exc), 0.0)
        limit = conn.config.tool_concurrency.get(tool)
        slots = [self._tool_slot(server, tool, limit)] if limit else []
        async with held(*slots, self._server_slots[server], priority=priority):
            return await self._timed(conn, tool, request)

    def _tool_slot(self, server: str, tool: str, limit: int) -> PrioritySemaphore:
        slot = self._tool_slots.get((server, tool))
        if slot is None:
            slot = self._tool_slots[(server, tool)] = PrioritySemaphore(limit)
        return slot

    async def _timed(self, conn: ServerConnection, tool: str,
                     request: types.CallToolRequest) -> ToolOutcome:
        from mcp.shared.exceptions import MCPError

        from app.tools.transports import call_tool

        timeout = conn.config.timeout_s
        gauge = self._in_flight.get(conn.name)
        if gauge is None:
            gauge = self._in_flight[conn.name] = metrics.tool_calls_in_flight.labels(conn.name)
        gauge.inc()
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout), conn.lease(timeout) as session:
                result = await call_tool(session, request)
            text = result_text(result)
            status = ToolCallStatus.error if result.is_error else ToolCallStatus.ok
        except TimeoutError:
            status, text = ToolCallStatus.timeout, f"tool call timed out after {timeout:g} s"
        except ServerUnavailable as exc:
            status, text = ToolCallStatus.error, str(exc)
        except MCPError as exc:
            status, text = ToolCallStatus.error, exc.error.message
        except Exception as exc:  # a broken connection: the lease had it checked
            status, text = ToolCallStatus.error, f"{type(exc).__name__}: {exc}"
        finally:
            gauge.dec()
        return self._settled(conn, tool, status, text, time.monotonic() - started)

    def _settled(self, conn: ServerConnection, tool: str, status: ToolCallStatus, text: str,
                 latency: float) -> ToolOutcome:
        """The call's metrics, and its outcome as the model reads it."""
        label = tool if tool in conn.tools else UNKNOWN_TOOL_LABEL
        series = self._series.get((conn.name, label, status))
        if series is None:
            series = self._series[(conn.name, label, status)] = (
                metrics.tool_calls_total.labels(conn.name, label, status),
                metrics.tool_call_duration.labels(conn.name, label))
        series[0].inc()
        series[1].observe(latency)
        # the text goes to the transcript: what no database stores (NUL, lone surrogates,
        # which UTF-8 cannot even encode) is replaced where it enters, as for gateway content
        text = storable(text)[0]
        size = len(text.encode())
        shown = text if status is ToolCallStatus.ok else f"error: {text}"
        return ToolOutcome(status, cut(shown, self.result_max_bytes), latency, size)
