"""Helpers of the client and CLI tests: request bodies and a TCP proxy that drops event streams."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from types import TracebackType
from typing import Any

import httpx

from tests.support import CLI

API_KEY = "client-test-key"
SERVICE_ENV = {"SWARM_API_KEYS": f"acme:{API_KEY}", "SWARM_SIMULATOR_LATENCY_MS": "20",
               "SWARM_SIMULATOR_LATENCY_JITTER_MS": "0"}


def five_agents(task: str, directives: str = "") -> dict[str, Any]:
    """A 5-agent swarm (one dependency); `directives` go into every agent's system prompt."""
    agents: list[dict[str, Any]] = [
        {"name": f"agent_{i}", "system_prompt": f"You are agent {i}. {directives}".strip()}
        for i in range(1, 6)]
    agents[4]["depends_on"] = ["agent_1"]
    return {"task": task, "agents": agents, "limits": {"budget_usd": 1.0}}


def _nth(data: bytes, needle: bytes, n: int) -> int | None:
    pos = -1
    for _ in range(n):
        pos = data.find(needle, pos + 1)
        if pos < 0:
            return None
    return pos


class CuttingProxy:
    """A TCP proxy in front of the API that closes the first event stream right after its
    `after`-th event, mid-body, as a server or load balancer going away would."""

    def __init__(self, upstream: str, after: int) -> None:
        url = httpx.URL(upstream)
        self.host, self.upstream_port = url.host, url.port or 80
        self.after = after
        self.cuts_left = 1
        self.cut = 0
        self.requests = bytearray()  # every request byte the clients sent, for assertions
        self.url = ""

    async def __aenter__(self) -> CuttingProxy:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        upstream = asyncio.create_task(self._requests(reader, up_writer))
        try:
            await self._responses(up_reader, writer)
        except ConnectionError:
            pass
        finally:
            upstream.cancel()
            writer.close()
            up_writer.close()

    async def _requests(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                self.requests += data
                up.write(data)
                await up.drain()

    async def _responses(self, up: asyncio.StreamReader, down: asyncio.StreamWriter) -> None:
        sent: bytes | None = None  # bytes of the stream being cut, once armed
        while data := await up.read(65536):
            if sent is None and self.cuts_left and b"text/event-stream" in data.lower():
                self.cuts_left -= 1
                sent = b""
            if sent is not None:
                # every event starts with an `id:` line: stop just before the next one
                pos = _nth(sent + data, b"\nid: ", self.after + 1)
                if pos is not None:
                    down.write((sent + data)[len(sent):pos])
                    await down.drain()
                    self.cut += 1
                    return
                sent += data
            down.write(data)
            await down.drain()


def cli(api_url: str, *args: str, stdin: str | None = None, key: str = API_KEY,
        timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
    env["SWARM_LOG_FORMAT"] = "text"  # the line itself, not a JSON record of it
    env.update({"SWARM_URL": api_url, "SWARM_API_KEY": key, "COLUMNS": "200"})
    return subprocess.run([CLI, *args], input=stdin, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
