"""Client CPU per gateway call on uvloop (as `serve` runs): GatewayClient, a bare aiohttp
session, and a minimal keep-alive HTTP/1.1 client (asyncio protocol + httptools, no TLS, no
proxy, no content decoding, no retries): the floor under what any client of this gateway
could spend, and so what replacing aiohttp's request machinery could save per subtask.

    .venv/bin/python -m bench.bench_wire_floor [--calls 5000] [--in-flight 64] [--rounds 3]

The simulator runs in its own process at 0 ms; variants alternate round by round; the figure
is `time.process_time()` of this process per call (median of the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import httptools
import uvloop

from app.aio import wait_for
from app.gateway.chat import ChatRequest
from app.gateway.client import GatewayClient
from tests.support import free_port, process

MESSAGES = [{"role": "user", "content": "Summarise the benchmark in one line."}]
BODY = json.dumps({"model": "kimi-k2.5", "messages": MESSAGES, "max_tokens": 16}).encode()


class _Answer(asyncio.Protocol):
    """One keep-alive connection: a request written whole, its answer parsed by httptools."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.body = bytearray()
        self.done: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's: no asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(bytes(self.body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc or ConnectionError("closed"))


class FloorClient:
    """The least a keep-alive HTTP/1.1 POST can cost in Python: idle connections in a list."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "", parts.port or 80
        self.head = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                     "Content-Type: application/json\r\n").encode()
        self.idle: list[_Answer] = []

    async def post(self, body: bytes, key: str) -> bytes:
        loop = asyncio.get_running_loop()
        if self.idle:
            conn = self.idle.pop()
        else:
            _, conn = await loop.create_connection(_Answer, self.host, self.port)
        conn.body = bytearray()
        conn.done = loop.create_future()
        assert conn.transport is not None
        conn.transport.write(b"%sIdempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s" % (
            self.head, key.encode(), len(body), body))
        answer = await wait_for(conn.done, 30)
        self.idle.append(conn)
        return answer

    def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()


async def _drive(call: Callable[[int], Awaitable[None]], calls: int, in_flight: int) -> float:
    """CPU ms per call over `calls`, `in_flight` at a time (after a warm-up)."""
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call(left)

    async def run(n: int) -> None:
        nonlocal left
        left = n
        await asyncio.gather(*(worker() for _ in range(in_flight)))

    await run(in_flight * 2)
    cpu = time.process_time()
    await run(calls)
    return (time.process_time() - cpu) / calls * 1000


async def gateway(url: str, calls: int, in_flight: int) -> float:
    client = GatewayClient(url, max_inflight=256)
    try:
        async def call(n: int) -> None:
            await client.complete(ChatRequest(model="kimi-k2.5", messages=MESSAGES,
                                              max_tokens=16, idempotency_key=f"k:{n}"))
        return await _drive(call, calls, in_flight)
    finally:
        await client.aclose()


async def bare_aiohttp(url: str, calls: int, in_flight: int) -> float:
    target = url + "/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
        async def call(n: int) -> None:
            async with session.post(target, data=BODY, headers={
                    "Content-Type": "application/json", "Idempotency-Key": f"k:{n}"}) as r:
                json.loads(await r.read())
        return await _drive(call, calls, in_flight)


async def floor(url: str, calls: int, in_flight: int) -> float:
    client = FloorClient(url + "/chat/completions")
    try:
        async def call(n: int) -> None:
            json.loads(await client.post(BODY, f"k:{n}"))
        return await _drive(call, calls, in_flight)
    finally:
        client.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    variants = {"GatewayClient": gateway, "aiohttp session": bare_aiohttp,
                "floor (protocol + httptools)": floor}
    got: dict[str, list[float]] = {name: [] for name in variants}
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with process(["simulator", "--port", str(port)], {"SWARM_SIM_LATENCY_MS": "0"},
                 f"{url}/models", Path(tempfile.mkdtemp()) / "sim.log"):
        for _ in range(args.rounds):
            for name, run in variants.items():
                got[name].append(uvloop.run(run(url, args.calls, args.in_flight)))
    print(f"{args.calls} calls, {args.in_flight} in flight, {args.rounds} rounds, "
          f"1-min load {os.getloadavg()[0]:.1f}: client CPU per call, uvloop")
    for name, runs in got.items():
        print(f"  {name}: {statistics.median(runs) * 1000:.0f} us "
              f"({', '.join(f'{x * 1000:.0f}' for x in runs)})")


if __name__ == "__main__":
    main()
