"""The example MCP server (examples/mcp/server.py) as real processes for the tool tests, a
registry of one such server, and readers of its call log (the server's own view: calls in
flight, calls per argument)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from app.tools.config import ServerConfig
from app.tools.registry import ToolRegistry

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "examples" / "mcp" / "server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpServer:
    """`server.py --http PORT` (`server`: another checkout's) as a subprocess, logging its
    calls to `log`."""

    def __init__(self, log: Path, delay_ms: float = 0, server: Path = SERVER) -> None:
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        env = {**os.environ, "EXAMPLE_MCP_LOG": str(log), "EXAMPLE_MCP_DELAY_MS": str(delay_ms)}
        self._out = (log.parent / f"{log.stem}-http-server.out").open("wb")
        self.popen = subprocess.Popen([sys.executable, str(server), "--http", str(self.port)],
                                      env=env, stdout=self._out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60  # importing the SDK is slow on a loaded machine
        while time.monotonic() < deadline:
            assert self.popen.poll() is None, "the MCP HTTP server exited"
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(self.url, timeout=0.5)  # any answer means it listens
                return
            time.sleep(0.1)
        raise AssertionError("the MCP HTTP server did not start")

    def close(self) -> None:
        self.popen.kill()
        self.popen.wait()
        self._out.close()


def stdio_server(log: Path, delay_ms: float = 0, **limits: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SERVER)],
            "env": {"EXAMPLE_MCP_LOG": str(log), "EXAMPLE_MCP_DELAY_MS": str(delay_ms)},
            **limits}


def write_config(path: Path, servers: dict[str, dict[str, Any]]) -> str:
    path.write_text(json.dumps({"mcpServers": servers}))
    return str(path)


def calls(log: Path, event: str = "start") -> list[dict[str, Any]]:
    if not log.exists():
        return []
    # the server may be writing a line as it is read: only whole (newline-ended) lines count
    lines = log.read_text(encoding="utf-8").split("\n")[:-1]
    return [e for e in map(json.loads, lines) if e["event"] == event]


def max_in_flight(log: Path, tool: str | None = None) -> int:
    """The most calls the server saw at once (of one tool, or of all)."""
    key = "in_flight" if tool is None else "tool_in_flight"
    return max((e[key] for e in calls(log) if tool is None or e["tool"] == tool), default=0)


def counts(log: Path) -> Counter[str]:
    """How often each (tool, arguments) was started."""
    return Counter(f"{e['tool']}:{json.dumps(e['args'], sort_keys=True)}" for e in calls(log))


@asynccontextmanager
async def registry(config: dict[str, object], http_sessions: int) -> AsyncIterator[ToolRegistry]:
    tools = ToolRegistry({"s": ServerConfig.model_validate(config)}, start_wait_s=120,
                         http_sessions=http_sessions)
    await tools.start()
    try:
        assert tools.states() == {"s": "up"}
        yield tools
    finally:
        await tools.stop()


@asynccontextmanager
async def http_server(log: Path, delay_ms: float = 0) -> AsyncIterator[HttpServer]:
    server = await asyncio.to_thread(HttpServer, log, delay_ms)
    try:
        yield server
    finally:
        server.close()
