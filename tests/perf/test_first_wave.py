"""A swarm this process claims as it creates it has its first calls written ahead in the creation's
statement (`SwarmRunner.first_wave`): the workers it sends first (no dependency, as many as its
concurrency; a tool-using worker's first turn) go out as soon as it starts, without a
write-ahead commit of their own. Every such row is still in the ledger before its call is sent,
is settled by the answer as any row written ahead, and one whose call is never sent settles
`cancelled` at no cost. With the tenant's daily cap, each row's reservation is made in that
statement too, unless the creation holds the tenant's admission lock to its commit (a token
bucket or an active-swarm count, as SPEC §8's defaults have): its calls then reserve in the
cap's batches. A creation that fails leaves none; with the latency devices off
(SWARM_LATENCY_DEVICES) the engine writes every call ahead. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.config import Settings
from app.db import changes
from app.db.tables import Swarm
from app.db.tenant_tables import TenantBucket, TenantDailyReservation, TenantDailySpend
from app.engine.runner import SwarmRunner
from app.engine.scheduler import Scheduler
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent, by_name, ledger, record_batches, until
from tests.mcp_servers import stdio_server, write_config

pytestmark = pytest.mark.latency_devices
SLOW = "[[sim latency_ms=1500]]"
# SPEC §8's defaults but the daily cap, which every tenant has by default (see the last test)
NO_DAILY_CAP = """[defaults]
max_agents = 1000
max_inflight_calls = 256
default_budget_usd = "10"
max_budget_usd = "100"
"""


def uncapped(database_url: str, tmp_path: Path, **kw: Any) -> Settings:
    path = tmp_path / "tenants.toml"
    path.write_text(NO_DAILY_CAP)
    return make_settings(database_url, tenants_file=str(path), **kw)


def written_ahead(batches: list[list[changes.SwarmWrite]], swarm_id: str) -> list[str]:
    """The subtasks whose `in_flight` rows the engine's writer committed for the swarm."""
    return sorted(r["subtask_name"] for batch in batches for w in batch
                  if w.swarm_id == swarm_id for r in w.ledger if r["outcome"] == "in_flight")


async def test_the_first_calls_are_written_with_the_creation(
        database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """a and b (concurrency 2) are the first wave: their rows come with the creation, in
    flight at their worst case before either call is sent; c (a's dependent) and d (past the
    concurrency) are written ahead by the engine as before. The creation's answer says no
    attempt was made yet; every row ends settled, the totals those of the ledger."""
    h, close = await start_harness(uncapped(database_url, tmp_path))
    batches = record_batches(h, monkeypatch)
    try:
        body = {"task": "t", "agents": [agent("a", SLOW), agent("b", SLOW),
                                        agent("c", depends_on=["a"]), agent("d")],
                "synthesis": {"strategy": "concatenate"}, "limits": {"concurrency": 2}}
        r = await h.post(body)
        assert r.status_code == 202, r.text
        created = r.json()
        assert {s["name"]: s["attempts"] for s in created["subtasks"]} == {
            "a": 0, "b": 0, "c": 0, "d": 0}

        async def on_the_wire() -> bool:
            return bool(h.sim_stats.in_flight == 2)

        await until(on_the_wire, 10, "a's and b's calls on the wire", every=0.02)
        # d's row too, written ahead by the engine while d waits for a's or b's slot
        ahead = {row.subtask_name: row for row in await ledger(h, created["id"])
                 if row.subtask_name in ("a", "b")}
        assert set(ahead) == {"a", "b"}
        for row in ahead.values():
            assert (row.outcome, row.attempt, row.cost_usd) == ("in_flight", 1, Decimal(0))
            assert row.reserved_usd > 0 and row.at_bound
        async with h.app.state.sessions() as s:
            reserved = (await s.execute(select(Swarm.reserved_usd).where(
                Swarm.id == created["id"]))).scalar_one()
        assert reserved >= sum(row.reserved_usd for row in ahead.values())

        data = await h.wait(created["id"])
        assert data["status"] == "succeeded", data["error"]
        assert written_ahead(batches, data["id"]) == ["c", "d"]
        rows = await ledger(h, data["id"])
        assert sorted((row.subtask_name, row.attempt, row.outcome) for row in rows) == [
            ("a", 1, "ok"), ("b", 1, "ok"), ("c", 1, "ok"), ("d", 1, "ok")]
        assert {n: s["attempts"] for n, s in by_name(data).items()} == {
            "a": 1, "b": 1, "c": 1, "d": 1}
        assert Decimal(data["usage"]["cost_usd"]) == sum(row.cost_usd for row in rows) > 0
        async with h.app.state.sessions() as s:
            swarm = (await s.execute(select(Swarm).where(Swarm.id == data["id"]))).scalar_one()
        assert swarm.reserved_usd == 0 and swarm.spent_usd == sum(row.cost_usd for row in rows)
    finally:
        await close()


@pytest.mark.parametrize("devices", [True, False])
async def test_a_one_agent_swarm_is_written_by_the_engine_without_a_write_ahead(
        database_url: str, devices: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With the latency devices off (SWARM_LATENCY_DEVICES), the engine writes its call ahead."""
    h, close = await start_harness(uncapped(database_url, tmp_path, latency_devices=devices))
    batches = record_batches(h, monkeypatch)
    try:
        data = await h.run({"task": "t", "agents": [agent("a")],
                            "synthesis": {"strategy": "none"}})
    finally:
        await close()
    assert data["status"] == "succeeded", data["error"]
    assert written_ahead(batches, data["id"]) == ([] if devices else ["a"])
    mine = [w for batch in batches for w in batch if w.swarm_id == data["id"]]
    outcomes = [r["outcome"] for w in mine for r in w.ledger]
    assert outcomes == (["ok"] if devices else ["in_flight", "ok"])  # the settlement alone


async def test_a_tenant_with_an_admission_lock_and_no_cap_writes_its_first_wave_too(
        database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A token bucket and `max_active_swarms` (the tenant's lock) without a daily cap: the
    creation's statement checks them once its subtasks and first calls are in, before the
    swarm's row (decision 0039), takes the token, and the engine writes no call of that wave
    again."""
    path = tmp_path / "tenants.toml"
    path.write_text(NO_DAILY_CAP + "requests_per_minute = 600\nburst = 100\n"
                    "max_active_swarms = 5\n")
    h, close = await start_harness(make_settings(database_url, tenants_file=str(path)))
    batches = record_batches(h, monkeypatch)
    try:
        data = await h.run({"task": "t", "agents": [agent("a"), agent("b")],
                            "synthesis": {"strategy": "concatenate"}})
        async with h.app.state.sessions() as s:
            tokens = (await s.execute(select(TenantBucket.tokens))).scalars().all()
    finally:
        await close()
    assert data["status"] == "succeeded", data["error"]
    assert written_ahead(batches, data["id"]) == []
    assert len(tokens) == 1 and 98 < tokens[0] < 99.5  # one taken, a little refilled


async def test_a_first_call_never_sent_settles_cancelled(database_url: str, tmp_path: Path
                                                         ) -> None:
    """One gateway slot in the process, held by another swarm's slow call: the new swarm's
    first call, written with its creation, waits for it; the swarm is cancelled meanwhile.
    Its row settles `cancelled`, costing nothing, counted in no attempt, nothing reserved."""
    h, close = await start_harness(uncapped(database_url, tmp_path, max_inflight=1))
    try:
        hog = (await h.post({"task": "t", "agents": [agent("hog", "[[sim latency_ms=3000]]")],
                             "synthesis": {"strategy": "none"}})).json()["id"]

        async def hog_on_the_wire() -> bool:
            return bool(h.sim_stats.in_flight == 1)

        await until(hog_on_the_wire, 10, "the hog's call on the wire", every=0.02)
        r = await h.post({"task": "t", "agents": [agent("a")], "synthesis": {"strategy": "none"}})
        swarm_id = r.json()["id"]
        (row,) = await ledger(h, swarm_id)
        assert (row.subtask_name, row.outcome) == ("a", "in_flight")
        await asyncio.sleep(0.2)  # it runs, waiting for the slot
        assert (await h.client.post(f"/swarms/{swarm_id}/cancel")).status_code == 202
        data = await h.wait(swarm_id)
        assert data["status"] == "cancelled"
        (row,) = await ledger(h, swarm_id)
        assert (row.outcome, row.cost_usd, row.attempt) == ("cancelled", Decimal(0), 1)
        a = by_name(data)["a"]
        assert a["attempts"] == 0 and a["status"] in ("pending", "skipped", "cancelled")
        assert data["usage"]["cost_usd"] == "0" and data["usage"]["gateway_calls"] == 0
        async with h.app.state.sessions() as s:
            reserved = (await s.execute(select(Swarm.reserved_usd).where(
                Swarm.id == swarm_id))).scalar_one()
        assert reserved == 0
        assert (await h.wait(hog))["status"] == "succeeded"
    finally:
        await close()


async def daily_rows(h: Harness) -> tuple[list[Decimal], list[Decimal]]:
    """(the tenant cap's live reservations, its days' settled spend)."""
    async with h.app.state.sessions() as s:
        held = list((await s.execute(select(TenantDailyReservation.amount))).scalars())
        spent = list((await s.execute(select(TenantDailySpend.spent_usd))).scalars())
    return held, spent


async def test_the_tenants_daily_cap_is_reserved_with_the_creation(
        database_url: str, tmp_path: Path) -> None:
    """A tenant with a daily cap and no admission lock (no bucket, no active-swarm count):
    the first call's reservation against the cap is made by the creation's statement, which
    writes its row: when the call is on the wire both are there, at the same worst case; the
    answer settles the cap to the cost."""
    path = tmp_path / "tenants.toml"
    path.write_text(NO_DAILY_CAP + 'daily_budget_usd = "500"\n')
    h, close = await start_harness(make_settings(database_url, tenants_file=str(path)))
    try:
        r = await h.post({"task": "t", "agents": [agent("a", SLOW)],
                          "synthesis": {"strategy": "none"}})
        swarm_id = r.json()["id"]

        async def on_the_wire() -> bool:
            return bool(h.sim_stats.in_flight == 1)

        await until(on_the_wire, 10, "a's call on the wire", every=0.02)
        (row,) = await ledger(h, swarm_id)
        held, _ = await daily_rows(h)
        assert row.outcome == "in_flight" and held == [row.reserved_usd]
        data = await h.wait(swarm_id)
        assert data["status"] == "succeeded", data["error"]
        held, spent = await daily_rows(h)
        assert held == [] and spent == [Decimal(data["usage"]["cost_usd"])] != [Decimal(0)]
    finally:
        await close()


async def test_a_first_call_the_tenants_cap_cannot_hold_is_not_written(
        database_url: str, tmp_path: Path) -> None:
    """A daily cap below the call's worst case: the creation's statement reserves nothing and
    writes no row for it; at its turn the call meets the same refusal as before: the worker
    fails `daily_budget_exceeded` (scope tenant), nothing sent, nothing spent."""
    path = tmp_path / "tenants.toml"
    path.write_text(NO_DAILY_CAP + 'daily_budget_usd = "0.0001"\n')
    h, close = await start_harness(make_settings(database_url, tenants_file=str(path)))
    try:
        data = await h.run({"task": "t", "agents": [agent("a")],
                            "synthesis": {"strategy": "none"}})
        assert data["status"] == "failed"
        a = by_name(data)["a"]
        assert a["error"]["code"] == "daily_budget_exceeded", a["error"]
        assert a["error"]["details"]["scope"] == "tenant"
        assert await ledger(h, data["id"]) == [] and a["attempts"] == 0
        assert await daily_rows(h) == ([], [Decimal(0)])
        assert h.sim_stats.calls == 0
    finally:
        await close()


async def test_a_tool_using_workers_first_turn_is_written_with_the_creation(
        database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A tool-using worker of the first wave has its first turn's row written with the
    creation, its reservation sized on the tools that turn offers (above a tool-less worker's
    with a prompt of the same length); the turn is sent with them, the tool runs, and the next
    turn's row is the engine's, written ahead with the first turn's end."""
    mcp = write_config(tmp_path / "mcp.json", {"docs": stdio_server(tmp_path / "docs.log")})
    h, close = await start_harness(uncapped(database_url, tmp_path, mcp_config=mcp))
    batches = record_batches(h, monkeypatch)
    try:
        data = await h.run({"task": "t", "agents": [agent("a", tools=["docs.lookup"]),
                                                    agent("b")],
                            "synthesis": {"strategy": "none"}}, timeout=60)
        rows = await ledger(h, data["id"])
    finally:
        await close()
    assert data["status"] == "succeeded", data["error"]
    assert by_name(data)["a"]["tool_calls"] == 1
    assert written_ahead(batches, data["id"]) == ["a"]  # its second turn's alone
    keyed = {(r.subtask_name, r.idempotency_key.rsplit(":", 1)[1]): r for r in rows}
    assert sorted(keyed) == [("a", "1"), ("a", "2"), ("b", "1")]
    assert {r.outcome for r in rows} == {"ok"}
    assert keyed[("a", "1")].reserved_usd > keyed[("b", "1")].reserved_usd > 0


@pytest.mark.parametrize("why", ["global daily cap", "admission lock", "planner"])
async def test_no_first_wave_where_a_call_needs_more_than_the_creation(
        database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, why: str) -> None:
    """The process-wide daily cap (SWARM_DAILY_BUDGET_USD) is asked in a statement of its own;
    so is the tenant's when its creation holds the tenant's admission lock (SPEC §8's
    defaults: a bucket, an active-swarm count, a daily cap); a planned swarm starts with its
    planner: their first rows are the engine's."""
    extra: dict[str, Any] = {}
    body: dict[str, Any] = {"task": "t", "agents": [agent("a")],
                            "synthesis": {"strategy": "none"}}
    if why == "global daily cap":
        extra["daily_budget_usd"] = Decimal("5")
    elif why == "admission lock":
        pass  # SPEC §8's defaults (below)
    else:
        body = {"task": "t", "orchestrator": {"max_subtasks": 2, "max_depth": 1},
                "synthesis": {"strategy": "concatenate"}}
    settings = (make_settings(database_url) if why == "admission lock"
                else uncapped(database_url, tmp_path, **extra))
    h, close = await start_harness(settings)
    batches = record_batches(h, monkeypatch)
    try:
        data = await h.run(body, timeout=60)
        rows = await daily_rows(h)
    finally:
        await close()
    assert data["status"] == "succeeded", data["error"]
    first = "@planner" if why == "planner" else "a"
    assert first in written_ahead(batches, data["id"])
    if why == "admission lock":  # reserved in the cap's batch, settled to the cost
        assert rows == ([], [Decimal(data["usage"]["cost_usd"])])


async def test_a_cancel_that_ends_a_lapsed_creators_swarm_bills_its_first_calls(
        database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The process that created (and claimed) the swarm stalls before starting it, past its
    lease; a cancel ends the `queued` swarm itself (tests/engine/test_cancel_fence.py). Its first
    call's row, written with the creation, may have been sent before the stall for all the
    cancel knows: it is billed `unknown` at its reservation, as a takeover bills a dead
    owner's. The creator, resumed, finds its lease gone before sending anything."""
    paused = asyncio.Event()
    start, beat = SwarmRunner._start, Scheduler._extend_leases

    async def late_start(self: Any) -> None:
        await paused.wait()
        await start(self)

    async def late_beat(self: Any) -> None:
        await paused.wait()
        await beat(self)

    monkeypatch.setattr(SwarmRunner, "_start", late_start)
    monkeypatch.setattr(Scheduler, "_extend_leases", late_beat)
    h, close = await start_harness(uncapped(database_url, tmp_path, lease_seconds=0.5))
    try:
        sid = (await h.post({"task": "t", "agents": [agent("a")],
                             "synthesis": {"strategy": "none"}})).json()["id"]
        await asyncio.sleep(0.8)  # past its lease
        r = await h.client.post(f"/swarms/{sid}/cancel")
        assert r.status_code == 202 and r.json()["status"] == "cancelled", r.text
        paused.set()
        await asyncio.sleep(0.5)
        data = (await h.client.get(f"/swarms/{sid}")).json()
        (row,) = await ledger(h, sid)
        assert (row.outcome, row.attempt, row.at_bound) == ("unknown", 1, True)
        assert row.cost_usd == row.reserved_usd > 0
        assert data["status"] == "cancelled" and h.sim_stats.calls == 0
        assert Decimal(data["usage"]["cost_usd"]) == row.cost_usd
        assert Decimal(data["usage"]["unresolved_usd"]) == row.cost_usd
        assert data["usage"]["gateway_calls"] == 1 and by_name(data)["a"]["attempts"] == 1
        async with h.app.state.sessions() as s:
            swarm = (await s.execute(select(Swarm).where(Swarm.id == sid))).scalar_one()
        assert swarm.reserved_usd == 0 and swarm.spent_usd == row.cost_usd
    finally:
        paused.set()
        await close()
