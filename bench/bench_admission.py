"""Admission cost: `POST /swarms` throughput with the tenant quotas on and off, in one run.

Two API processes (`serve --no-engine`) on one throwaway PostgreSQL database, each with its
own tenants file: "on" sets every SPEC §8 key (generous enough that nothing is refused, so each
request pays for the token bucket upsert, the active-swarm count and the daily-cap lookup),
"off" sets none (admission does nothing). Rounds alternate between the two so that load on the
machine and the growing queue fall on both alike. Reports creations per second of each and
their ratio, printed (bench/RESULTS.md's "Other workloads" row is updated from them).

    .venv/bin/python -m bench.bench_admission [--requests 400] [--clients 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from tests.support import free_port, process, throwaway_db

TITLE = "## Admission: `POST /swarms` with tenant quotas on and off"
ON = """[defaults]
requests_per_minute = 10000000
burst = 1000000
max_active_swarms = 10000000
max_agents = 1000
max_inflight_calls = 256
default_budget_usd = "10"
max_budget_usd = "100"
daily_budget_usd = "500"
max_streams = 100
"""
BODY = {"task": "admission", "agents": [{"name": "a"}], "synthesis": {"strategy": "none"}}


async def round_(url: str, requests: int, clients: int) -> float:
    """Creations per second of `requests` POSTs from `clients` concurrent connections."""
    gate = asyncio.Semaphore(clients)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(
            max_connections=clients)) as client:
        async def one() -> None:
            async with gate:
                r = await client.post(f"{url}/swarms", json=BODY)
                if r.status_code != 202:
                    raise RuntimeError(f"{url}: {r.status_code} {r.text[:200]}")

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        return requests / (time.perf_counter() - t0)


async def measure(urls: dict[str, str], args: argparse.Namespace) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {name: [] for name in urls}
    for url in urls.values():  # warm-up: connections, caches, first rows
        await round_(url, 50, args.clients)
    for i in range(args.rounds):
        order = list(urls) if i % 2 == 0 else list(reversed(urls))
        for name in order:
            got[name].append(await round_(urls[name], args.requests, args.clients))
    return got


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, throwaway_db("swarm_bench") as db_url:
        work = Path(tmp)
        (work / "on.toml").write_text(ON)
        (work / "off.toml").write_text("[defaults]\n")
        base = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
        base.update({"SWARM_DATABASE_URL": db_url, "SWARM_AUTO_MIGRATE": "0"})
        ports = {"on": free_port(), "off": free_port()}
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        with process(["serve", "--no-engine", "--port", str(ports["on"])],
                     {**base, "SWARM_TENANTS_FILE": str(work / "on.toml")},
                     f"{urls['on']}/readyz", work / "on.log"), \
             process(["serve", "--no-engine", "--port", str(ports["off"])],
                     {**base, "SWARM_TENANTS_FILE": str(work / "off.toml")},
                     f"{urls['off']}/readyz", work / "off.log"):
            got = asyncio.run(measure(urls, args))
    on, off = statistics.median(got["on"]), statistics.median(got["off"])
    rows = "\n".join(f"| {name} | {', '.join(f'{v:.0f}' for v in got[name])} | "
                     f"{statistics.median(got[name]):.0f} |" for name in ("off", "on"))
    text = f"""{TITLE}

`.venv/bin/python -m bench.bench_admission --requests {args.requests} --clients \
{args.clients} --rounds {args.rounds}` ({dt.date.today()}, {platform.machine()},
{os.cpu_count()} cores shared with other work, PostgreSQL, two `serve --no-engine` processes,
1-agent swarms, rounds alternating). "on": every SPEC §8 key set, nothing refused (each `POST`
pays for the bucket upsert, the active count and the tenant's day lookup in one extra
transaction); "off": a tenants file with no keys.

| admission | creations/s per round | median |
|---|---|---|
{rows}

**on / off = {on / off:.2f}** (throughput with admission ÷ without, same run).
"""
    print(text)


if __name__ == "__main__":
    main()
