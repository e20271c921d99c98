"""What encryption at rest costs (SPEC §16): `POST /swarms` throughput under 50 concurrent
clients (1-agent swarms, engine in the process) and a 100-agent fan-out with synthesis at 0 ms
(the service's own overhead, nothing to hide it), each with SWARM_ENCRYPTION_KEYS unset and
set, in one run: two `swarm-api serve` processes (one per mode, each on a throwaway PostgreSQL)
against one simulator, measured in turn, alternating, median of `--runs`.

    .venv/bin/python -m bench.bench_encryption [--runs 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import platform
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.bench_create import BODY, drained, post_load, serve_db, tenants_file
from bench.bench_table import run_swarm, swarm_body
from tests.support import free_port, process

# a task and prompts of a realistic size: encryption's cost grows with the bytes sealed
TASK = ("Review the payment service's refund path for race conditions and write up the "
        "findings with the code references. " * 8)


def creation_body() -> dict[str, Any]:
    return {**BODY, "task": TASK}


def fanout_body() -> dict[str, Any]:
    body = swarm_body(100, 0, "synthesize", 100)
    body["task"] = f"{TASK} [[sim latency_ms=0]]"
    return body


async def one_round(api: str, clients: int, each: int) -> tuple[float, float]:
    """(creations per second, the 100-agent fan-out's wall seconds) of one serve."""
    load = await post_load(api, clients, each, creation_body(), client="aiohttp")
    if load["errors"]:
        raise RuntimeError(f"creation errors: {load['kinds']}")
    await drained(api)
    async with httpx.AsyncClient(base_url=api, timeout=120) as c:
        wall = await run_swarm(c, fanout_body())
    return float(load["per_s"]), wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a smoke run: fewer requests")
    args = ap.parse_args()
    clients, each = (10, 5) if args.quick else (50, 20)
    key = base64.b64encode(os.urandom(32)).decode()
    work = Path(tempfile.mkdtemp(prefix="bench-enc-"))
    sim_port = free_port()
    sim = f"http://127.0.0.1:{sim_port}/v1"
    apis = {"off": f"http://127.0.0.1:{free_port()}", "on": f"http://127.0.0.1:{free_port()}"}
    got: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    with contextlib.ExitStack() as stack:
        stack.enter_context(process(["simulator", "--port", str(sim_port)],
                                    {"SWARM_SIM_LATENCY_MS": "0"}, f"{sim}/models",
                                    work / "sim.log"))
        for mode, api in apis.items():
            db = stack.enter_context(serve_db("swarm_bench_enc"))
            env = {**db, "SWARM_GATEWAY_URL": sim, "SWARM_MAX_INFLIGHT": "256",
                   "SWARM_TENANTS_FILE": str(tenants_file(work)),
                   "SWARM_ENCRYPTION_KEYS": key if mode == "on" else ""}
            port = api.rsplit(":", 1)[1]
            stack.enter_context(process(["serve", "--port", port], env, f"{api}/readyz",
                                        work / f"api-{mode}.log"))
        for api in apis.values():  # a warm-up round each, not counted
            asyncio.run(one_round(api, clients, max(each // 4, 1)))
        for _ in range(args.runs):
            for mode, api in apis.items():
                got[mode].append(asyncio.run(one_round(api, clients, each)))
    print(f"machine: {platform.node()}, {os.cpu_count()} cores; {args.runs} runs, "
          f"{clients} clients x {each} creations")
    print("| row | encryption off | encryption on | cost |")
    print("|---|---|---|---|")
    for i, (name, unit, higher) in enumerate((("creation, 50 clients", "/s", True),
                                               ("100-agent fan-out at 0 ms", " s", False))):
        off = statistics.median(r[i] for r in got["off"])
        on = statistics.median(r[i] for r in got["on"])
        cost = (off / on - 1) if higher else (on / off - 1)
        spread = {m: f"{min(r[i] for r in got[m]):.3g}-{max(r[i] for r in got[m]):.3g}"
                  for m in got}
        print(f"| {name} | {off:.3g}{unit} ({spread['off']}) | {on:.3g}{unit} "
              f"({spread['on']}) | {cost * 100:+.1f} % |")


if __name__ == "__main__":
    main()
