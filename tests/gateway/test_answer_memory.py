"""Giant answers do not take `serve` down (SPEC §4 "bounded answers"), with real processes on
PostgreSQL: four 24 MiB answers to 1,500-token calls (read up to their 1 MiB bound, then
refused) beside a normal swarm: the giant swarm fails `invalid_response` with nothing stored,
the normal one succeeds, and `serve`'s peak resident memory grows by less than 96 MB (the
whole answers read and stored took it from ~110 MB to ~1.1 GB)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import agent
from tests.procs import Db, cluster, post_swarm, wait_http, wait_terminal
from tests.support import free_port, memory, reset_peak

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(180)]

MIB = 1024 * 1024


async def test_four_giant_answers_beside_a_normal_swarm(db_url: str, tmp_path: Path) -> None:
    db = Db(db_url)
    async with cluster(db_url, tmp_path) as c:
        await c.simulator(latency_ms=20)
        port = free_port()
        serve = c.spawn("serve", ["serve", "--port", str(port)])
        api = f"http://127.0.0.1:{port}"
        await wait_http(serve, f"{api}/readyz", ok_only=True)
        normal = {"task": "normal", "max_tokens": 200,
                  "agents": [agent("a"), agent("b")]}
        warm = await wait_terminal(api, (await post_swarm(api, normal))["id"], timeout=60)
        assert warm["status"] == "succeeded", warm  # imports and first-use caches are in
        reset_peak(serve.pid)
        before, _ = memory(serve.pid)

        giant = {"task": "giant", "max_tokens": 1500, "synthesis": {"strategy": "none"},
                 "agents": [agent(f"g{i}", f"[[sim answer_bytes={24 * MIB}]]")
                            for i in range(4)]}
        giant_id = (await post_swarm(api, giant))["id"]
        normal_id = (await post_swarm(api, normal))["id"]
        refused = await wait_terminal(api, giant_id, timeout=90)
        ok = await wait_terminal(api, normal_id, timeout=90)
        _, peak = memory(serve.pid)

        assert ok["status"] == "succeeded", ok
        assert refused["status"] == "failed", refused
        # the first refusal fails the swarm: the calls it cut off are `unknown` (or never sent)
        outcomes = {r["outcome"] for r in await db.ledger(giant_id)}
        assert "invalid_response" in outcomes, outcomes
        assert outcomes <= {"invalid_response", "unknown", "cancelled"}, outcomes
        assert [s["output"] for s in (await db.subtasks(giant_id)).values()] == [None] * 4
        grew = peak - before
        print(f"\nserve: {before / MIB:.0f} MiB before, peak {peak / MIB:.0f} MiB "
              f"(+{grew / MIB:.1f} MiB)")
        assert grew < 96 * 1000 * 1000, grew
