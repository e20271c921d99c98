"""The daily cap holds across a stall (SPEC §8), with real processes on PostgreSQL: a worker
with calls in flight, their worst cases reserved, is stopped (SIGSTOP) for 20 s, ten leases,
while another worker takes its swarm over and runs more swarms against the same cap; then
it goes on. Its reservations expired long before, yet hold their money until settled: what
the gateway answered, what the ledger recorded and what the day's row counts all stay within
the cap."""

from __future__ import annotations

import asyncio
import signal
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import agent, until
from tests.procs import (
    Db,
    answered_usd,
    cluster,
    owner_pid,
    post_swarm,
    sim_stats,
    wait_terminal,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(240)]

CAP = Decimal("0.003")  # about five calls' worst case (max_tokens 200 on kimi-k2.5)
STALL_S = 20.0


def body(task: str, n: int, latency_ms: int) -> dict[str, Any]:
    return {"task": task, "max_tokens": 200, "synthesis": {"strategy": "none"},
            "agents": [agent(f"a{i}", f"[[sim latency_ms={latency_ms}]]") for i in range(n)]}


async def test_the_daily_cap_holds_across_a_20_s_stall_of_a_worker_holding_reservations(
        db_url: str, tmp_path: Path) -> None:
    db = Db(db_url)
    async with cluster(db_url, tmp_path, SWARM_DAILY_BUDGET_USD=str(CAP)) as c:
        sim = await c.simulator(latency_ms=20)
        api, a = await asyncio.gather(c.api(), c.worker("worker_a"))
        # answered while A is stopped: A reads them only after SIGCONT
        first = (await post_swarm(api, body("stalled", 3, 3000)))["id"]

        async def reserved() -> bool:
            rows = await db.fetch("SELECT count(*) FROM daily_reservations")
            return (await sim_stats(sim))["in_flight"] == 3 and rows[0][0] == 3

        await until(reserved, 30, "three calls in flight, reserved")
        a.send(signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        resume_at = loop.time() + STALL_S
        b = await c.worker("worker_b")
        more = [(await post_swarm(api, body(f"more {i}", 3, 100)))["id"] for i in range(4)]

        async def taken_over() -> bool:
            return owner_pid(await db.lease_owner(first)) == b.pid

        await until(taken_over, STALL_S, "worker B to take the stalled swarm over")
        await asyncio.sleep(max(resume_at - loop.time(), 0))
        expired = await db.fetch("SELECT count(*) FROM daily_reservations "
                                 "WHERE expires_at < now()")
        assert expired[0][0] >= 3, "the stalled worker's reservations had expired"
        a.send(signal.SIGCONT)
        done = [await wait_terminal(api, i, timeout=60) for i in [first, *more]]
        await a.wait_log("lease lost", timeout=30)  # fenced, and alive
        assert a.alive, a.log()[-3000:]

        async def settled() -> bool:  # the stalled worker settles what its calls cost
            return not await db.fetch("SELECT 1 FROM daily_reservations")

        await until(settled, 30, "every reservation settled")
        stats = await sim_stats(sim)
        ledger = await db.fetch("SELECT sum(cost_usd) FROM gateway_calls")
        day = await db.fetch("SELECT sum(spent_usd) FROM daily_spend")

    answered = answered_usd(stats)
    recorded, spent = ledger[0][0], day[0][0]
    assert answered <= CAP and recorded <= CAP and spent <= CAP, (answered, recorded, spent)
    assert answered <= recorded  # what the gateway may bill is recorded
    codes = [d["error"]["code"] for d in done if d["status"] == "failed"]
    assert codes and set(codes) == {"daily_budget_exceeded"}, done  # the cap did bind
    print(f"\ncap {CAP}: answered {answered}, recorded {recorded}, day row {spent}")
