"""A poison swarm (its call ends the worker's process each time) against churn-proof
crash-loop detection, with real processes on PostgreSQL: it fails `internal` after
SWARM_MAX_RESCUES fruitless takeovers, naming its call in flight each time, while the swarms
that shared its dying workers progress through the same takeovers and succeed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.helpers import agent
from tests.procs import Db, cluster, post_swarm, wait_terminal

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(120)]

POISON = {"task": "poison", "max_tokens": 50, "synthesis": {"strategy": "none"},
          "agents": [agent("p", "[[sim exit=3 latency_ms=800]]")]}


def chain(n: int) -> dict[str, object]:
    names = [f"s{i}" for i in range(n)]
    return {"task": "healthy", "max_tokens": 50, "synthesis": {"strategy": "none"},
            "agents": [agent(name, depends_on=names[i - 1:i]) for i, name in enumerate(names)]}


async def test_a_poison_swarm_fails_internal_while_its_neighbours_succeed(
        db_url: str, tmp_path: Path) -> None:
    db = Db(db_url)
    env = {"SWARM_MAX_RESCUES": "2", "SWARM_SIMULATOR_EXIT_ALLOWED": "1",
           "SWARM_SIMULATOR_LATENCY_MS": "300", "SWARM_SIMULATOR_LATENCY_JITTER_MS": "0"}
    async with cluster(db_url, tmp_path, **env) as c:
        # one worker first: it takes every swarm, so the healthy ones share its death
        api, first = await asyncio.gather(c.api(), c.worker("worker_1"))
        healthy = [(await post_swarm(api, chain(6)))["id"] for _ in range(4)]
        poison = (await post_swarm(api, POISON))["id"]
        assert await first.wait_exit(30) == 3, first.log()
        others = await asyncio.gather(c.worker("worker_2"), c.worker("worker_3"))

        data = await wait_terminal(api, poison, timeout=60)
        assert data["status"] == "failed" and data["error"]["code"] == "internal", data
        details = data["error"]["details"]
        assert details["rescues"] == 2
        assert [t["in_flight"] for t in details["takeovers"]] == [["p"], ["p"]]
        # the first owner died, one more took it over and died, the next failed it
        assert [w.alive for w in others].count(False) == 1
        assert [await w.wait_exit(5) for w in others if not w.alive] == [3]

        for swarm_id in healthy:
            done = await wait_terminal(api, swarm_id, timeout=60)
            assert done["status"] == "succeeded", done
            row = await db.swarm(swarm_id)
            # taken over from the dead worker, each takeover fruitful: no rescue counted
            assert row["lease_epoch"] >= 2 and row["rescues"] == 0, dict(row)
