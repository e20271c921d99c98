"""The trigger-kept active counts `max_active_swarms` reads (migration 0024) through the service's
own paths, on both databases: a swarm counts from its creation (held for approval too, SPEC §8)
and stops counting at every end — success, failure, the cancel of a queued swarm and of a
running one, a rejection, the approval timeout — so the tenant's count is back at 0, and a
creation is admitted again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, text

from tests.conftest import make_settings, start_harness
from tests.helpers import on_sync

ONE = {"task": "t", "agents": [{"name": "a"}], "synthesis": {"strategy": "none"}}
SLOW = {"task": "t", "agents": [{"name": "a", "system_prompt": "[[sim latency_ms=20000]]"}],
        "synthesis": {"strategy": "none"}}
FAILING = {"task": "t", "agents": [{"name": "a", "system_prompt": "[[sim fail=400]]"}],
           "synthesis": {"strategy": "none"}}
AGENTS = [{"name": "alpha", "prompt": "say alpha"}, {"name": "beta", "prompt": "say beta"}]
TENANTS = '[defaults]\nmax_active_swarms = 3\ndaily_budget_usd = "100"\n'


def _kept_and_counted(conn: Connection) -> tuple[int, int]:
    kept = conn.execute(text("SELECT coalesce(sum(active), 0) FROM tenant_active")).scalar_one()
    rows = conn.execute(text(
        "SELECT count(*) FROM swarms WHERE status IN ('queued', 'awaiting_approval', "
        "'planning', 'running', 'synthesizing')")).scalar_one()
    return int(kept), int(rows)


async def held(h: Any, timeout_s: float | None = None) -> str:
    """A swarm held for approval at its creation (named agents: planned already)."""
    limits: dict[str, Any] = {"approval": "always"}
    if timeout_s is not None:
        limits["approval_timeout_s"] = timeout_s
    r = await h.post({"task": "review the plan", "agents": AGENTS, "limits": limits})
    assert r.status_code == 202 and r.json()["status"] == "awaiting_approval", r.text
    return str(r.json()["id"])


async def active(url: str) -> int:
    kept, counted = await asyncio.to_thread(on_sync, url, _kept_and_counted)
    assert kept == counted
    return kept


async def test_every_end_takes_the_swarm_out_of_the_count(database_url: str,
                                                          tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    settings: dict[str, Any] = {"tenants_file": str(tenants), "poll_interval_s": 0.1}
    # a queued swarm, cancelled before any engine claims it
    h, close = await start_harness(make_settings(database_url, **settings), run_engine=False)
    try:
        queued = (await h.post(ONE)).json()["id"]
        assert await active(database_url) == 1
        r = await h.client.post(f"/swarms/{queued}/cancel")
        assert r.status_code == 202 and r.json()["status"] == "cancelled", r.text
        assert await active(database_url) == 0
    finally:
        await close()
    h, close = await start_harness(make_settings(database_url, **settings))
    try:
        assert (await h.run(ONE))["status"] == "succeeded"
        assert (await h.run(FAILING))["status"] == "failed"
        assert await active(database_url) == 0

        running = (await h.post(SLOW)).json()["id"]
        rejected = await held(h)
        timed_out = await held(h, timeout_s=2)
        assert await active(database_url) == 3
        over = await h.post({"task": "t", "agents": AGENTS})  # the 4th: refused
        assert over.status_code == 429 and over.json()["error"]["details"]["count"] == 3

        r = await h.client.post(f"/swarms/{running}/cancel")
        assert r.status_code == 202, r.text
        assert (await h.wait(running))["status"] == "cancelled"
        r = await h.client.post(f"/swarms/{rejected}/reject")
        assert r.status_code == 202 and r.json()["status"] == "cancelled", r.text
        done = await h.wait(timed_out)
        assert (done["status"], done["error"]["code"]) == ("failed", "approval_timeout")
        assert await active(database_url) == 0
        assert (await h.run(ONE))["status"] == "succeeded"  # admitted again
        assert await active(database_url) == 0
    finally:
        await close()
