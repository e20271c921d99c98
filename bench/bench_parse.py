"""The CPU one `POST /swarms` costs this process, with its request parsed by hand (the
service's route, app/api/request_parser.py) and by FastAPI (a twin app whose plain `APIRoute`
runs the same endpoint on the same state): blocks of requests alternate between the two in
one process, on PostgreSQL, engine off, so the machine's drift hits both alike.

    .venv/bin/python -m bench.bench_parse [--requests 300] [--rounds 7] [--agents 1]

Each figure is process CPU (user + system) per request, the in-process client's share included
and the same for both; their difference is what the parsing costs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.routing import APIRoute

from app.api import errors
from app.api.swarms import create_swarm
from app.config import Settings
from app.main import create_app
from bench.service import tenants_file
from tests.support import throwaway_db


async def block(client: httpx.AsyncClient, body: dict[str, Any], n: int) -> float:
    """CPU seconds per request over `n` sequential requests."""
    t0 = time.process_time()
    for _ in range(n):
        r = await client.post("/swarms", json=body)
        assert r.status_code == 202, r.text
    return (time.process_time() - t0) / n


async def measure(db: str, requests: int, rounds: int, agents: int) -> dict[str, list[float]]:
    # SPEC §8's rate limit lifted, as bench_create does (a 429 would end the run)
    tenants = tenants_file(Path(tempfile.mkdtemp()))
    app = create_app(Settings(_env_file=None, database_url=db,  # type: ignore[call-arg]
                              tenants_file=str(tenants)), run_engine=False)
    twin = FastAPI()
    errors.install(twin)
    twin.state = app.state
    twin.router.routes.append(APIRoute("/swarms", create_swarm, methods=["POST"],
                                       status_code=202))
    body = {"task": "t", "agents": [{"name": f"a{i}"} for i in range(agents)],
            "synthesis": {"strategy": "none"}}
    out: dict[str, list[float]] = {"by hand": [], "FastAPI": []}
    async with app.router.lifespan_context(app):
        clients = {name: httpx.AsyncClient(transport=httpx.ASGITransport(app=a),
                                           base_url="http://api")
                   for name, a in (("by hand", app), ("FastAPI", twin))}
        for c in clients.values():
            await block(c, body, 20)  # warm-up
        for _ in range(rounds):
            for name, c in clients.items():
                out[name].append(await block(c, body, requests))
        for c in clients.values():
            await c.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--agents", type=int, default=1)
    args = ap.parse_args()
    with throwaway_db("swarm_bench_parse") as db:
        out = asyncio.run(measure(db, args.requests, args.rounds, args.agents))
    for name, xs in out.items():
        print(f"{name:8}: median {statistics.median(xs) * 1000:.3f} ms CPU per POST "
              f"(rounds: {', '.join(f'{x * 1000:.3f}' for x in xs)})")
    diffs = [f - h for h, f in zip(out["by hand"], out["FastAPI"], strict=True)]
    print(f"FastAPI - by hand, per round: median {statistics.median(diffs) * 1000:.3f} ms")


if __name__ == "__main__":
    main()
