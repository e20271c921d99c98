"""Memory per answered byte on the accepted path: a fresh `swarm-api serve` (engine on, its
gateway a simulator process of its own, PostgreSQL) runs one swarm whose agents each get a
large answer to a 128k-token call (under the call's bound, so read, parsed, stored, evented);
the figure is the growth of serve's peak resident memory (VmHWM, from a warm baseline) over
the bytes answered.

    .venv/bin/python -m bench.bench_answer_memory [--sizes-mib 1 4] [--agents 4] [--repeat 1]

The swarm is waited for in the database, not through the API: the figure is the engine's
path (socket, parse, views, events, the stored output), not a reader's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.procs import TERMINAL, Cluster, Db, post_swarm, wait_http
from tests.support import free_port, memory, reset_peak, throwaway_db

MIB = 1024 * 1024


def body(agents: int, answer_bytes: int) -> dict[str, Any]:
    return {"task": "large answers", "max_tokens": 128_000, "synthesis": {"strategy": "none"},
            "agents": [{"name": f"a{i}", "system_prompt": f"[[sim answer_bytes={answer_bytes}]]"}
                       for i in range(agents)]}


async def ended(db: Db, swarm_id: str, timeout_s: float = 300) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status: str = (await db.swarm(swarm_id))["status"]
        if status in TERMINAL:
            return status
        await asyncio.sleep(0.1)
    raise RuntimeError(f"swarm {swarm_id} not terminal after {timeout_s}s")


async def one(db_url: str, agents: int, size: int) -> dict[str, float]:
    """A fresh serve: warm it up with a small swarm, then the measured one."""
    db = Db(db_url)
    c = Cluster(db_url, Path(tempfile.mkdtemp(prefix="bench-answer-memory-")))
    try:
        await c.simulator(latency_ms=20)
        port = free_port()
        serve = c.spawn("serve", ["serve", "--port", str(port)])
        api = f"http://127.0.0.1:{port}"
        await wait_http(serve, f"{api}/readyz", timeout=120, ok_only=True)
        warm = await post_swarm(api, body(agents, 64 * 1024))
        assert await ended(db, warm["id"]) == "succeeded"
        reset_peak(serve.pid)
        before, _ = memory(serve.pid)
        swarm = await post_swarm(api, body(agents, size))
        status = await ended(db, swarm["id"])
        _, peak = memory(serve.pid)
        assert status == "succeeded", status
        stored = await db.fetch("SELECT sum(length(output)) FROM subtasks WHERE swarm_id = $1",
                                swarm["id"])
        assert stored[0][0] == agents * size  # every answer read whole and stored
        answered = agents * size
        return {"before_mib": before / MIB, "peak_mib": peak / MIB,
                "grew_mib": (peak - before) / MIB, "answered_mib": answered / MIB,
                "factor": (peak - before) / answered}
    finally:
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mib", type=float, nargs="+", default=[1.0, 4.0])
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    rows = []
    with throwaway_db("bench_answer_memory") as db_url:
        for size_mib in args.sizes_mib:
            for _ in range(args.repeat):
                r = asyncio.run(one(db_url, args.agents, int(size_mib * MIB)))
                rows.append(r)
                print(f"{args.agents} x {size_mib:g} MiB answered: serve {r['before_mib']:.0f}"
                      f" -> peak {r['peak_mib']:.0f} MiB (+{r['grew_mib']:.1f} MiB), "
                      f"{r['factor']:.2f} bytes of memory per byte answered", flush=True)
    print(f"median factor {statistics.median(r['factor'] for r in rows):.2f}")


if __name__ == "__main__":
    main()
