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
import json
import os
import time
from collections import Counter
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

ROOT = Path(os.environ.get("EXAMPLE_MCP_ROOT") or Path(__file__).with_name("data")).resolve()
DELAY_S = float(os.environ.get("EXAMPLE_MCP_DELAY_MS", "0")) / 1000
LOG = os.environ.get("EXAMPLE_MCP_LOG")

server = MCPServer("example", instructions="Look things up in a local folder of text files.",
                   log_level="WARNING")  # a log line per request costs more than the call
_in_flight: Counter[str] = Counter()


def _record(event: str, tool: str, args: dict[str, object], session: str | None) -> None:
    if LOG:
        line = json.dumps({"event": event, "tool": tool, "args": args, "pid": os.getpid(),
                           "session": session,
                           "in_flight": sum(_in_flight.values()),
                           "tool_in_flight": _in_flight[tool], "t": time.time()})
        with open(LOG, "a", encoding="utf-8") as f:  # one append a line: none interleave
            f.write(line + "\n")


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
        hits = [f"{p.name}: {line}" for p in sorted(ROOT.glob("*.txt"))
                for line in p.read_text(encoding="utf-8").splitlines() if needle in line.lower()]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP")
    parser.add_argument("--host", default="127.0.0.1")
    opts = parser.parse_args()
    if opts.http is None:
        server.run()
    else:
        # plain JSON answers (no SSE stream per call): several times the calls per second
        server.run("streamable-http", host=opts.host, port=opts.http, json_response=True)


if __name__ == "__main__":
    main()
