"""Client CPU per gateway call: a bare httpx pool, a bare aiohttp session, and GatewayClient.

Run: .venv/bin/python bench/bench_gateway_pool.py [--calls 3000] [--rounds 2]

A zero-latency gateway runs in its own process (the built-in simulator when app.simulator
exists, else the tiny ASGI app below), so `time.process_time()` here counts only client work.
Prints its figures (bench/RESULTS.md's "Other workloads" row is updated from them).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.gateway.chat import ChatRequest  # noqa: E402
from app.gateway.client import GatewayClient  # noqa: E402

LEVELS = (16, 64, 256)
VARIANTS = ("single", "aiohttp", "gateway")
# Retried attempts per variant, reported so a run that needed many is visible.
RETRIES = dict.fromkeys(VARIANTS, 0)
HEADING = "## Gateway client: per-call CPU vs in-flight calls"
MESSAGES = [{"role": "user", "content": "Summarise the benchmark in one line."}]
REPLY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
    }
).encode()


async def _tiny_gateway(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The fallback server: reads the request and answers one fixed completion."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": REPLY})


def _serve(port: int, kind: str) -> None:
    if kind == "simulator":
        from app.simulator import SimulatorConfig, run_simulator

        run_simulator("127.0.0.1", port, SimulatorConfig(latency_ms=0))
    else:
        import uvicorn

        uvicorn.run(_tiny_gateway, host="127.0.0.1", port=port, log_level="warning")


def _start_server(kind: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, __file__, "--serve", str(port), "--server", kind]
    server = subprocess.Popen(command, cwd=ROOT)
    base_url = f"http://127.0.0.1:{port}/v1"
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return server, base_url
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise SystemExit(f"the {kind} server did not start on port {port}")


async def _drive(call: Callable[[], Awaitable[None]], calls: int, inflight: int) -> None:
    """Keep exactly `inflight` calls running until `calls` have finished."""
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    await asyncio.gather(*(worker() for _ in range(inflight)))


async def _measure(
    call: Callable[[], Awaitable[None]], calls: int, inflight: int
) -> tuple[float, float]:
    """(client CPU ms per call, calls per second), after a warm-up that opens the connections."""
    await _drive(call, inflight * 2, inflight)
    cpu, wall = time.process_time(), time.perf_counter()
    await _drive(call, calls, inflight)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / calls * 1000, calls / wall


async def _single_pool(base_url: str, calls: int, inflight: int) -> tuple[float, float]:
    limits = httpx.Limits(max_connections=inflight, max_keepalive_connections=inflight)
    url = httpx.URL(base_url + "/chat/completions")
    body = json.dumps({"model": "kimi-k2.5", "messages": MESSAGES, "max_tokens": 16}).encode()
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def call() -> None:
            for _ in range(3):  # like GatewayClient, ride out a rare reset connection
                try:
                    response = await client.post(url, content=body, headers=headers)
                except httpx.TransportError:
                    RETRIES["single"] += 1
                    continue
                response.raise_for_status()
                json.loads(response.content)
                return
            raise RuntimeError("three transport errors in a row")

        return await _measure(call, calls, inflight)


async def _bare_aiohttp(base_url: str, calls: int, inflight: int) -> tuple[float, float]:
    url = base_url + "/chat/completions"
    body = json.dumps({"model": "kimi-k2.5", "messages": MESSAGES, "max_tokens": 16}).encode()
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=inflight)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def call() -> None:
            for _ in range(3):
                try:
                    async with session.post(url, data=body, headers=headers) as response:
                        response.raise_for_status()
                        json.loads(await response.read())
                        return
                except aiohttp.ClientConnectionError:
                    RETRIES["aiohttp"] += 1
            raise RuntimeError("three transport errors in a row")

        return await _measure(call, calls, inflight)


async def _gateway_client(base_url: str, calls: int, inflight: int) -> tuple[float, float]:
    client = GatewayClient(base_url, max_inflight=inflight)
    request = ChatRequest(model="kimi-k2.5", messages=MESSAGES, max_tokens=16)

    async def call() -> None:
        result = await client.complete(request)
        RETRIES["gateway"] += len(result.attempts) - 1

    try:
        return await _measure(call, calls, inflight)
    finally:
        await client.aclose()


async def _run(
    base_url: str, calls: int, rounds: int
) -> dict[tuple[str, int], tuple[float, float]]:
    """Best (lowest CPU) of `rounds` runs per variant and level, variants interleaved."""
    best: dict[tuple[str, int], tuple[float, float]] = {}
    for _ in range(rounds):
        for inflight in LEVELS:
            for variant in VARIANTS:
                run = {"single": _single_pool, "aiohttp": _bare_aiohttp,
                       "gateway": _gateway_client}[variant]
                figures = await run(base_url, calls, inflight)
                key = (variant, inflight)
                if key not in best or figures[0] < best[key][0]:
                    best[key] = figures
    return best


def _table(best: dict[tuple[str, int], tuple[float, float]]) -> str:
    lines = [
        "| in flight N | httpx, one pool of N | aiohttp, one session | GatewayClient "
        "| GatewayClient / httpx |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in LEVELS:
        cells = [f"{best[v, n][0]:.2f} ms ({best[v, n][1]:,.0f}/s)" for v in VARIANTS]
        ratio = best["gateway", n][0] / best["single", n][0]
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
    return "\n".join(lines)


def _has_sniffio() -> str:
    # Without it httpcore re-tries `import sniffio` (a failing path search) on every lock setup.
    return "yes" if importlib.util.find_spec("sniffio") else "no"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server", choices=["auto", "simulator", "tiny"], default="auto")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    kind = args.server
    if kind == "auto":
        kind = "simulator" if (ROOT / "app" / "simulator").is_dir() else "tiny"
    if args.serve is not None:
        _serve(args.serve, kind)
        return

    server, base_url = _start_server(kind)
    try:
        started = time.perf_counter()
        best = asyncio.run(_run(base_url, args.calls, args.rounds))
        elapsed = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(10)
    table = _table(best)
    retries = ", ".join(f"{variant} {count}" for variant, count in RETRIES.items())
    table += f"\n\nRetried attempts (connection resets and the like): {retries}."
    print(f"({elapsed:.0f} s)")
    command = f".venv/bin/python bench/bench_gateway_pool.py --calls {args.calls}"
    command += f" --rounds {args.rounds} --server {kind}"
    server_name = (
        "the built-in simulator (latency_ms=0)" if kind == "simulator" else "a tiny ASGI app"
    )
    section = f"""{HEADING}

Client CPU (`time.process_time()` of the client process) per call, best of {args.rounds} rounds of
{args.calls} calls per cell, after a warm-up that opens the connections; calls/s in brackets.
The gateway is {server_name} under uvicorn in its own process, so its CPU is not
counted (but it shares the machine's {os.cpu_count()} cores, which bounds calls/s).
"httpx, one pool of N" is a bare `AsyncClient.post` + `json.loads` with `max_connections = N`;
"aiohttp, one session" the same over an aiohttp session of N connections; "GatewayClient" is
the full client (body building, classification, tenacity, records; aiohttp underneath). The
last column is GatewayClient CPU over the bare httpx pool.

{table}

- command: `{command}`
- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; Python {platform.python_version()}, \
httpx {httpx.__version__}, aiohttp {aiohttp.__version__}, {platform.machine()}; \
sniffio installed: {_has_sniffio()}
"""
    print(section)


if __name__ == "__main__":
    main()
