"""A swarm awaiting approval with real processes on PostgreSQL (SPEC §14): it calls nothing
while API replicas and workers poll for work, survives a restart of every process
(simulator, API, worker: each SIGKILLed), and runs once approved.

The wait stands in for SPEC's minute by its claim polls: at SWARM_POLL_INTERVAL_S 0.05 a
worker polls the queue as often in 3 s as at the default 1 s in a minute, and a claim is the
only way a held swarm could be run (nothing else calls the gateway for it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import agent, until
from tests.procs import Cluster, Db, cluster, get_swarm, post_swarm, sim_stats, wait_terminal

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(240)]

POLLS_OF_A_MINUTE_S = 3.0  # 60 claim polls at 0.05 s


async def start(c: Cluster, worker: str) -> tuple[str, str]:
    """Simulator, API replica and worker: (the API's URL, the simulator's)."""
    sim = await c.simulator(latency_ms=0)
    api, _ = await asyncio.gather(c.api(), c.worker(worker))  # both start in seconds
    return api, sim


async def held_now(db: Db, swarm_id: str) -> dict[str, Any]:
    row = await db.swarm(swarm_id)
    assert row["status"] == "awaiting_approval", dict(row)
    assert (row["lease_owner"], row["reserved_usd"]) == (None, 0), dict(row)
    return dict(row)


async def test_held_swarms_call_nothing_and_survive_a_restart_of_every_process(
        db_url: str, tmp_path: Path) -> None:
    db = Db(db_url)
    async with cluster(db_url, tmp_path, SWARM_POLL_INTERVAL_S="0.05") as c:
        api, sim = await start(c, "worker-1")
        named = await post_swarm(api, {"task": "review the plan", "limits": {
            "approval": "always"}, "agents": [agent("alpha"), agent("beta")]})
        assert named["status"] == "awaiting_approval"
        planned = await post_swarm(api, {"task": "plan the audit", "limits": {
            "approval": "always"}, "orchestrator": {"max_subtasks": 3}})

        async def is_held() -> bool:
            return (await get_swarm(api, planned["id"]))["status"] == "awaiting_approval"

        await until(is_held, 60, "the planned swarm to be held")
        await asyncio.sleep(POLLS_OF_A_MINUTE_S)
        assert (await sim_stats(sim))["calls"] == 1  # the planner's, before it was held
        assert await db.ledger(named["id"]) == []
        assert len(await db.ledger(planned["id"])) == 1
        before = {s: await held_now(db, s) for s in (named["id"], planned["id"])}

        for proc in list(c.procs):  # every process, at once, with no chance to clean up
            proc.kill()
        c.procs.clear()
        api, sim = await start(c, "worker-2")
        await asyncio.sleep(POLLS_OF_A_MINUTE_S)
        assert (await sim_stats(sim))["calls"] == 0
        for swarm_id, row in before.items():
            again = await held_now(db, swarm_id)
            assert again["approval"] == row["approval"] and again["event_seq"] == row[
                "event_seq"]
        assert len(await db.ledger(planned["id"])) == 1

        async with httpx.AsyncClient(base_url=api, timeout=10) as client:
            for swarm_id in before:
                r = await client.post(f"/swarms/{swarm_id}/approve")
                assert r.status_code == 202, r.text
        for swarm_id in before:
            done = await wait_terminal(api, swarm_id, timeout=60)
            assert done["status"] == "succeeded", done
        called = {k.split(":")[1] for k in (await sim_stats(sim))["by_key"]
                  if k.startswith(planned["id"])}
        assert "@planner" not in called and called  # planned once, before the restart
