"""The OpenAI facade's overhead, measured with the official SDK (ratios within one run).

- passthrough: the same chat completions through `POST /v1/chat/completions` (metered: a
  ledger row per attempt, the daily cap when set) vs straight to the simulator, both served by
  uvicorn in this process, concurrency `--concurrency`;
- swarm: `agent_swarm` through the facade (one request that waits) vs `POST /swarms` +
  `GET /swarms/{id}?wait=` for the same task, sequentially.

Run: `.venv/bin/python -m bench.bench_facade [--calls 200] [--swarms 10] [--concurrency 8]`
(SQLite in a temporary directory, simulator latency `--latency-ms`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from openai import AsyncOpenAI

from app.config import Settings
from app.gateway.client import GatewayClient
from app.main import create_app
from app.simulator import SimulatorConfig, create_simulator
from tests.facade.live import serving

KEY = "k1"


async def timed(n: int, concurrency: int, call: Callable[[int], Awaitable[Any]]) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await call(i)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - start


async def main(calls: int, swarms: int, concurrency: int, latency_ms: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
        simulator = create_simulator(SimulatorConfig(latency_ms=latency_ms))
        gateway = GatewayClient("http://sim/v1", transport=httpx.ASGITransport(app=simulator))
        settings = Settings(_env_file=None, database_url=url,  # type: ignore[call-arg]
                            api_keys=f"t1:{KEY}", simulator_latency_ms=latency_ms)
        app = create_app(settings, gateway=gateway)
        async with serving(app) as base, serving(simulator) as sim_base:  # type: ignore[arg-type]
            facade = AsyncOpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
            direct = AsyncOpenAI(base_url=f"{sim_base}/v1", api_key="x", max_retries=0)

            def plain(client: AsyncOpenAI) -> Callable[[int], Awaitable[Any]]:
                return lambda i: client.chat.completions.create(
                    model="deepseek-v3.2", max_tokens=64,
                    messages=[{"role": "user", "content": f"question {i}"}])

            await timed(20, concurrency, plain(facade))  # warm-up: connections, imports
            await timed(20, concurrency, plain(direct))
            t_direct = await timed(calls, concurrency, plain(direct))
            t_facade = await timed(calls, concurrency, plain(facade))

            http = httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {KEY}"},
                                     timeout=60)
            body = {"task": "Review the payment service", "model": "kimi-k2.5",
                    "synthesis": {"strategy": "vote"}}
            via_api, via_facade = [], []
            for i in range(swarms):
                start = time.perf_counter()
                r = await http.post("/swarms", json={**body, "task": f"{body['task']} {i}"})
                while r.json()["status"] not in ("succeeded", "failed", "cancelled"):
                    r = await http.get(f"/swarms/{r.json()['id']}", params={"wait": 30})
                via_api.append(time.perf_counter() - start)
                start = time.perf_counter()
                await facade.chat.completions.create(
                    model="kimi-k2.5", messages=[{"role": "user",
                                                  "content": f"{body['task']} {i}"}],
                    extra_body={"agent_swarm": {"enabled": True,
                                                "fan_in_strategy": "weighted_vote"}})
                via_facade.append(time.perf_counter() - start)
            await http.aclose()
        await gateway.aclose()
    api_med, facade_med = statistics.median(via_api), statistics.median(via_facade)
    print(f"passthrough: {calls} calls, concurrency {concurrency}, simulator {latency_ms:g} ms")
    print(f"  direct to the simulator {calls / t_direct:.0f} calls/s, through the facade "
          f"{calls / t_facade:.0f} calls/s: facade / direct wall = {t_facade / t_direct:.2f}")
    print(f"swarm (planned, 4 workers, vote): {swarms} each, medians")
    print(f"  POST /swarms + ?wait {api_med * 1000:.0f} ms, facade {facade_med * 1000:.0f} ms: "
          f"facade / API = {facade_med / api_med:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--swarms", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.swarms, args.concurrency, args.latency_ms))
