"""What encryption at rest costs (SPEC §16): `POST /swarms` throughput under 50 concurrent
clients (1-agent swarms, engine in the process) and a 100-agent fan-out with synthesis at 0 ms
(the service's own overhead, nothing to hide it), each with SWARM_ENCRYPTION_KEYS unset and
set, in one run: two `swarm-api serve` processes (one per mode, each on a throwaway PostgreSQL)
against one simulator, measured in turn, alternating, median of `--runs`. Beside each wall
figure, the serve process's CPU for the same work (user + system): on a machine other work
shares, the steadier of the two. And the cost of sealing and opening one value alone.

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
import time
from pathlib import Path
from typing import Any

import httpx

from app.crypto import Sealer, parse_keys
from bench.bench_create import BODY, drained, post_load
from bench.cpu import cpu_s
from bench.service import serve_db, tenants_file
from bench.table_rows import run_swarm, swarm_body
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


# fan-outs a round: their CPU in clock ticks (10 ms) needs several to read
FANOUTS = 5


async def one_round(api: str, pid: int, clients: int, each: int) -> tuple[float, ...]:
    """Of one serve: creations per second, its CPU ms per creation (the engine's run of the
    swarm included), the 100-agent fan-out's wall seconds and its CPU seconds."""
    cpu0 = cpu_s(pid)
    load = await post_load(api, clients, each, creation_body(), client="aiohttp")
    if load["errors"]:
        raise RuntimeError(f"creation errors: {load['kinds']}")
    await drained(api)
    cpu1 = cpu_s(pid)
    async with httpx.AsyncClient(base_url=api, timeout=120) as c:
        walls = [await run_swarm(c, fanout_body()) for _ in range(FANOUTS)]
    cpu2 = cpu_s(pid)
    return (float(load["per_s"]), (cpu1 - cpu0) * 1000 / (clients * each),
            statistics.median(walls), (cpu2 - cpu1) / FANOUTS)


def per_value_us(size: int = 2048, n: int = 2000) -> tuple[float, float]:
    """µs to seal, and to open, one value of `size` characters (an output)."""
    sealer = Sealer(parse_keys(base64.b64encode(os.urandom(32)).decode()))
    text = ("x" * size)
    t0 = time.perf_counter()
    sealed = [sealer.seal(text) for _ in range(n)]
    t1 = time.perf_counter()
    for value in sealed:
        sealer.open(value)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e6 / n, (t2 - t1) * 1e6 / n


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
    got: dict[str, list[tuple[float, ...]]] = {"off": [], "on": []}
    pids: dict[str, int] = {}
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
            pids[mode] = stack.enter_context(process(
                ["serve", "--port", port], env, f"{api}/readyz", work / f"api-{mode}.log")).pid
        for mode, api in apis.items():  # a warm-up round each, not counted
            asyncio.run(one_round(api, pids[mode], clients, max(each // 4, 1)))
        for _ in range(args.runs):
            for mode, api in apis.items():
                got[mode].append(asyncio.run(one_round(api, pids[mode], clients, each)))
    print(f"machine: {platform.node()}, {os.cpu_count()} cores; {args.runs} runs, "
          f"{clients} clients x {each} creations")
    print("| row | encryption off | encryption on | cost |")
    print("|---|---|---|---|")
    rows = (("creation, 50 clients", "/s", True), ("serve CPU per creation", " ms", False),
            ("100-agent fan-out at 0 ms", " s", False), ("serve CPU per fan-out", " s", False))
    # CPU is read in clock ticks: a fan-out's figure is the mean of FANOUTS
    for i, (name, unit, higher) in enumerate(rows):
        off = statistics.median(r[i] for r in got["off"])
        on = statistics.median(r[i] for r in got["on"])
        cost = (off / on - 1) if higher else (on / off - 1)
        spread = {m: f"{min(r[i] for r in got[m]):.3g}-{max(r[i] for r in got[m]):.3g}"
                  for m in got}
        print(f"| {name} | {off:.3g}{unit} ({spread['off']}) | {on:.3g}{unit} "
              f"({spread['on']}) | {cost * 100:+.1f} % |")

    seal, opened = per_value_us()
    print(f"| seal / open one 2 KB value | | {seal:.1f} / {opened:.1f} µs | |")


if __name__ == "__main__":
    main()
