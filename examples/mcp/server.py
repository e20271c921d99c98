"""An example MCP server over a local folder (no network): `lookup` and `read_file`.

Run over stdio (the default) or streamable HTTP (`--http PORT`). Two more tools show what a
swarm does with tools that misbehave: `fail` raises, `sleep` takes its time.

Environment:
  EXAMPLE_MCP_ROOT      the folder served (default: data/ beside this file)
  EXAMPLE_MCP_DELAY_MS  latency added to every call (benchmarks)
  EXAMPLE_MCP_LOG       a file to append one JSON line per call start and end, with the calls
                        in flight at that moment and the HTTP session it came on (the server's
                        own view of concurrency)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import stat
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server

ROOT = Path(os.environ.get("EXAMPLE_MCP_ROOT") or Path(__file__).with_name("data")).resolve()
DELAY_S = float(os.environ.get("EXAMPLE_MCP_DELAY_MS", "0")) / 1000
LOG = os.environ.get("EXAMPLE_MCP_LOG")
RACY_NS = 1_000_000_000  # file times move in clock ticks (milliseconds), not nanoseconds

server = MCPServer("example", instructions="Look things up in a local folder of text files.",
                   log_level="WARNING")  # a log line per request costs more than the call
# the SDK wraps every request in an OpenTelemetry span, a no-op until an exporter is installed;
# this server installs none, so it takes the middleware out as the SDK says to opt out
server._lowlevel_server.middleware = [m for m in server._lowlevel_server.middleware
                                      if not isinstance(m, OpenTelemetryMiddleware)]
_in_flight: Counter[str] = Counter()
_log_fd: int | None = None


def _record(event: str, tool: str, args: dict[str, object], session: str | None) -> None:
    global _log_fd
    if LOG:
        line = json.dumps({"event": event, "tool": tool, "args": args, "pid": os.getpid(),
                           "session": session,
                           "in_flight": sum(_in_flight.values()),
                           "tool_in_flight": _in_flight[tool], "t": time.time()})
        if _log_fd is None:  # opened once: an open and a close a line cost more than the call
            _log_fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(_log_fd, (line + "\n").encode())  # one append a line: none interleave


class _Folder:
    """The folder's `*.txt` lines, read once and again only for a file whose mtime or size
    changed (or when the folder's own mtime says files came or went): a stat a file a call,
    not a read. A file or folder changed within RACY_NS of now is read again every call, as
    a later change in the same clock tick could leave its mtime as it is."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._folder_mtime = -1
        self._names: list[str] = []
        # name -> ((mtime_ns, size), [(line lower-cased, "name: line")])
        self._files: dict[str, tuple[tuple[int, int], list[tuple[str, str]]]] = {}
        self._all: list[tuple[str, str]] = []

    def lines(self) -> list[tuple[str, str]]:
        now = time.time_ns()
        try:
            mtime = os.stat(self.root).st_mtime_ns
        except FileNotFoundError:  # no folder: nothing matches
            mtime = -1
        if mtime != self._folder_mtime or now - mtime < RACY_NS:
            self._folder_mtime = mtime
            self._names = sorted(p.name for p in self.root.glob("*.txt")) if mtime >= 0 else []
        files: dict[str, tuple[tuple[int, int], list[tuple[str, str]]]] = {}
        for name in self._names:
            path = self.root / name
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            key = (st.st_mtime_ns, st.st_size)
            cached = self._files.get(name)
            if cached is None or cached[0] != key or now - st.st_mtime_ns < RACY_NS:
                text = path.read_text(encoding="utf-8")
                cached = (key, [(line.lower(), f"{name}: {line}") for line in text.splitlines()])
            files[name] = cached
        if files != self._files:
            self._files = files
            self._all = [line for _, lines in files.values() for line in lines]
        return self._all


_folder = _Folder(ROOT)


def _session(ctx: Context) -> str | None:
    """The streamable-HTTP session the call came on (None over stdio)."""
    return (ctx.headers or {}).get("mcp-session-id")


async def _enter(tool: str, args: dict[str, object], ctx: Context) -> None:
    _in_flight[tool] += 1
    _record("start", tool, args, _session(ctx))
    if DELAY_S:
        await asyncio.sleep(DELAY_S)


def _leave(tool: str, args: dict[str, object], ctx: Context) -> None:
    _in_flight[tool] -= 1
    _record("end", tool, args, _session(ctx))


@server.tool()
async def lookup(query: str, ctx: Context) -> str:
    """Lines of the folder's files that contain `query` (case-insensitive)."""
    await _enter("lookup", {"query": query}, ctx)
    try:
        needle = query.lower()
        hits = [shown for lower, shown in _folder.lines() if needle in lower]
        return f"lookup {query!r}: " + ("; ".join(hits) if hits else "no match")
    finally:
        _leave("lookup", {"query": query}, ctx)


@server.tool()
async def read_file(ctx: Context, path: str = "README.txt") -> str:
    """The text of one file of the folder (a path inside it, e.g. `planets.txt`)."""
    await _enter("read_file", {"path": path}, ctx)
    try:
        target = (ROOT / path).resolve()
        if not target.is_relative_to(ROOT) or not target.is_file():
            raise ToolError(f"no file {path!r} in the folder")
        return target.read_text(encoding="utf-8")
    finally:
        _leave("read_file", {"path": path}, ctx)


@server.tool()
async def fail(reason: str, ctx: Context) -> str:
    """Always raises: shows how a failing tool reaches the model."""
    await _enter("fail", {"reason": reason}, ctx)
    try:
        raise ToolError(f"fail was asked to fail: {reason}")
    finally:
        _leave("fail", {"reason": reason}, ctx)


@server.tool()
async def sleep(ctx: Context, seconds: float = 5.0) -> str:
    """Sleeps, then answers: shows how a slow tool meets its server's timeout."""
    await _enter("sleep", {"seconds": seconds}, ctx)
    try:
        await asyncio.sleep(min(max(seconds, 0.0), 60.0))
        return f"slept {seconds} s"
    finally:
        _leave("sleep", {"seconds": seconds}, ctx)


class _PipeIn:
    """Lines of a pipe read on the event loop, for the SDK's stdio transport: its own reads
    each line in a worker thread (as it writes and flushes each answer), and those thread hops
    cost a stdio call more CPU than the tool."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _PipeIn:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")  # as the SDK's own reader decodes


class _PipeOut:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, text: str) -> None:
        self._writer.write(text.encode())

    async def flush(self) -> None:
        await self._writer.drain()


def _is_pipe(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@asynccontextmanager
async def _stdio_pipes() -> AsyncIterator[tuple[Any, Any]]:
    """(stdin, stdout) for `stdio_server` when both are pipes (as a client starts the server),
    else (None, None): the SDK's own. As the SDK's claim of the standard streams does, fd 0
    reads the null device and fd 1 writes to stderr meanwhile, so nothing stray reaches the
    wire."""
    if not (_is_pipe(0) and _is_pipe(1)):
        yield None, None
        return
    wire_in, wire_out = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    try:
        os.dup2(2, 1)
    except OSError:  # no stderr: stray output goes nowhere
        os.dup2(null, 1)
    os.close(null)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 28, loop=loop)  # a request is one line
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(wire_in, "rb", 0))
    write_transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop),
        os.fdopen(wire_out, "wb", 0))
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    try:
        yield _PipeIn(reader), _PipeOut(writer)
    finally:
        read_transport.close()
        write_transport.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


async def _serve_stdio() -> None:
    """`server.run()`'s stdio loop, on `_stdio_pipes`."""
    low = server._lowlevel_server
    async with _stdio_pipes() as (stdin, stdout), stdio_server(stdin, stdout) as (read, write):
        await low.run(read, write, low.create_initialization_options())


def _run(serve: Callable[[], Awaitable[None]]) -> None:
    """`serve` on uvloop when it is installed (the SDK runs on anyio, which takes it as an
    option of its asyncio backend): a call's event-loop work costs less."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        anyio.run(serve)
    else:
        anyio.run(serve, backend_options={"use_uvloop": True})


def _quiet_collector() -> None:
    """The collector set as `swarm-api serve` sets its own (docs/decisions/0012 and 0034): a
    call allocates hundreds of containers that live until its answer, so at CPython's
    threshold (700) a wave of calls ran the collector many times over everything in flight, and
    each full pass walked the ~160,000 objects the SDK's modules and models keep for the
    process's life. The calls' objects are freed by reference counting all the same."""
    gc.set_threshold(10_000, 10, 10)
    gc.collect()
    gc.freeze()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP")
    parser.add_argument("--host", default="127.0.0.1")
    opts = parser.parse_args()
    _quiet_collector()
    if opts.http is None:
        _run(_serve_stdio)
    else:
        # plain JSON answers (no SSE stream per call): several times the calls per second
        _run(partial(server.run_streamable_http_async, host=opts.host, port=opts.http,
                     json_response=True))


if __name__ == "__main__":
    main()
