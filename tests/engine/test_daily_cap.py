"""SWARM_DAILY_BUDGET_USD is a hard cap across swarms, engines and processes (SPEC §4)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import delete, func, select

from app.aio import wait_for
from app.db.session import make_db_engine, make_session_factory
from app.db.tables import DailyReservation, DailySpend, GatewayCall, Swarm
from app.engine.budget import BudgetExceeded, DailyCap
from app.gateway.client import GatewayClient
from app.runtime import make_scheduler
from app.simulator import SimulatorConfig, create_simulator
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import until

CAP = Decimal("0.01")
BIN = Path(sys.executable).parent


def swarm_body(i: int, agents: int = 6) -> dict[str, Any]:
    return {"task": f"task {i}", "max_tokens": 400, "limits": {"concurrency": agents},
            "synthesis": {"strategy": "none"},
            "agents": [{"name": f"a{j}", "system_prompt": f"[[sim latency_ms={10 + 7 * j}]]"}
                       for j in range(agents)]}


async def clear_daily(url: str) -> None:
    """The daily tables outlive the per-test truncation of the shared Postgres database."""
    db = make_db_engine(url)
    try:
        async with make_session_factory(db)() as s, s.begin():
            await s.execute(delete(DailyReservation))
            await s.execute(delete(DailySpend))
    finally:
        await db.dispose()


async def totals(sessions: Any) -> tuple[Decimal, Decimal, int]:
    """(ledger spend, daily_spend spend, reservations left) over every day in the database."""
    async with sessions() as s:
        ledger = (await s.execute(select(func.sum(GatewayCall.cost_usd)))).scalar_one()
        daily = (await s.execute(select(func.sum(DailySpend.spent_usd)))).scalar_one()
        left = (await s.execute(select(func.count()).select_from(DailyReservation))).scalar_one()
    return ledger or Decimal(0), daily or Decimal(0), int(left)


async def wait_all(h: Harness, ids: list[str], timeout: float = 60) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(h.wait(i, timeout) for i in ids)))


def assert_capped(runs: list[dict[str, Any]], ledger: Decimal, daily: Decimal) -> None:
    codes = [(r["error"] or {}).get("code") for r in runs]
    assert "daily_budget_exceeded" in codes, codes
    assert set(codes) <= {None, "daily_budget_exceeded"}, codes
    assert all(r["status"] in ("succeeded", "failed") for r in runs)
    assert Decimal(0) < ledger <= CAP
    assert daily == ledger  # the cap's own ledger settled to the real costs, exactly
    assert sum(Decimal(r["usage"]["cost_usd"]) for r in runs) == ledger


class Engines:
    """Engines built like `serve`/`worker` build theirs (make_scheduler), each with its
    own pool and gateway client as if in its own process, sharing one simulator."""

    def __init__(self, url: str, settings: Any) -> None:
        self.url, self.settings = url, settings
        self.simulator = create_simulator(SimulatorConfig(latency_ms=5))
        self.started: list[tuple[Any, GatewayClient, Any, DailyCap | None]] = []

    async def start(self, n: int) -> None:
        for _ in range(n):
            db = make_db_engine(self.url)
            gateway = GatewayClient("http://sim/v1",
                                    transport=httpx.ASGITransport(app=self.simulator))
            engine, daily = make_scheduler(self.settings, make_session_factory(db),
                                                 gateway)
            assert isinstance(daily, DailyCap) and engine.ctx.daily is daily
            await engine.start()
            self.started.append((db, gateway, engine, daily))

    @property
    def owners(self) -> set[str]:
        return {e.owner for _, _, e, _ in self.started}

    async def stop(self) -> None:
        for db, gateway, engine, daily in self.started:
            await engine.stop()
            assert daily is not None
            await daily.close()
            await gateway.aclose()
            await db.dispose()


async def run_capped(url: str, engines: int, swarms: int) -> tuple[Harness, set[str]]:
    """Queue the swarms first, then start the engines, and wait for every swarm."""
    await clear_daily(url)
    settings = make_settings(url, daily_budget_usd=CAP, max_running_swarms=3)
    api, close_api = await start_harness(settings, run_engine=False)
    group = Engines(url, settings)
    try:
        ids = []
        for i in range(swarms):
            r = await api.post(swarm_body(i))
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
        await group.start(engines)
        runs = await wait_all(api, ids)
        ledger, daily, left = await totals(api.app.state.sessions)
        assert_capped(runs, ledger, daily)
        assert left == 0  # every reservation settled or released
        async with api.app.state.sessions() as s:
            seen = set((await s.execute(select(Swarm.lease_owner))).scalars())
        metrics = (await api.client.get("/metrics")).text
    finally:
        await group.stop()
        await close_api()
    denials = next(line for line in metrics.splitlines()
                   if line.startswith('swarm_budget_denials_total{scope="daily"}'))
    assert float(denials.split()[-1]) >= 1
    failed = next(r for r in runs if r["error"])
    assert "daily budget" in failed["error"]["message"]
    return api, seen & group.owners


async def test_swarms_stop_with_daily_budget_exceeded(database_url: str) -> None:
    await run_capped(database_url, engines=1, swarms=6)


async def test_two_engines_never_exceed_the_cap_together(database_url: str) -> None:
    _, owners = await run_capped(database_url, engines=2, swarms=8)
    if database_url.startswith("postgresql"):
        # both engines ran swarms (SQLite is the single-process mode: two engines in one process
        # may legitimately leave all the claiming to one of them)
        assert len(owners) == 2


async def test_serve_wires_the_cap_into_its_engine(sqlite_url: str) -> None:
    h, close = await start_harness(make_settings(sqlite_url, daily_budget_usd=CAP))
    try:
        engine = h.app.state.engine
        assert isinstance(engine.ctx.daily, DailyCap) and engine.ctx.daily.limit == CAP
    finally:
        await close()
    h, close = await start_harness(make_settings(sqlite_url))
    try:
        assert h.app.state.engine.ctx.daily is None
    finally:
        await close()


async def test_reservation_of_a_dead_process_holds_its_day(database_url: str) -> None:
    """A process that died with a reservation may have sent (and been billed for) the call
    it covered: its reservation holds its amount for the rest of the day. (Freed when its
    lease lapsed, another process could spend the whole cap before the takeover counted the
    dead call: real spend past the cap — found by a probe session.) Once expired it is no
    longer live: a reservation that does not fit beside it is refused at once."""
    await clear_daily(database_url)
    db = make_db_engine(database_url)
    sessions = make_session_factory(db)
    dead = DailyCap(sessions, Decimal("0.001"), "dead", lease_s=0.3)
    alive = DailyCap(sessions, Decimal("0.001"), "alive", lease_s=5)
    try:
        await dead.reserve(Decimal("0.0008"))
        await dead.close()  # stops refreshing, as if the process had died
        await asyncio.sleep(0.5)  # its lease lapses
        with pytest.raises(BudgetExceeded) as exc:  # nothing live: refused at once
            await wait_for(alive.reserve(Decimal("0.0005")), 1)
        assert exc.value.left == Decimal("0.0002")
        held = await wait_for(alive.reserve(Decimal("0.0002")), 1)
        await alive.settle(held, Decimal("0.0001"))
        await alive.settle(held, Decimal("0.0001"))  # settling twice counts once
        assert (await totals(sessions))[1:] == (Decimal("0.0001"), 1)  # the dead row holds
        with pytest.raises(BudgetExceeded) as exc:
            await wait_for(alive.reserve(Decimal("0.00011")), 1)
        assert exc.value.left == Decimal("0.0001")
    finally:
        await alive.close()
        await db.dispose()


async def test_live_reservations_are_refreshed_past_their_lease(database_url: str) -> None:
    await clear_daily(database_url)
    db = make_db_engine(database_url)
    sessions = make_session_factory(db)
    slow = DailyCap(sessions, Decimal("0.001"), "slow", lease_s=0.3)
    other = DailyCap(sessions, Decimal("0.001"), "other", lease_s=5)
    try:
        held = await slow.reserve(Decimal("0.0008"))
        await asyncio.sleep(1.0)  # three leases: still refreshed, still counted
        waiter = asyncio.create_task(other.reserve(Decimal("0.0005")))
        await asyncio.sleep(0.5)
        assert not waiter.done()
        await slow.settle(held, Decimal("0.0001"))
        await other.settle(await wait_for(waiter, 5), Decimal(0))
    finally:
        await slow.close()
        await other.close()
        await db.dispose()


async def _wait_terminal(client: httpx.AsyncClient, ids: list[str],
                         procs: list[subprocess.Popen[bytes]]) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        runs = [(await client.get(f"/swarms/{i}")).json() for i in ids]
        if all(r["status"] in ("succeeded", "failed", "cancelled") for r in runs):
            return runs
        assert all(p.poll() is None for p in procs), "a worker died"
        assert loop.time() < deadline, [r["status"] for r in runs]
        await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_two_worker_processes_share_the_cap(pg_template: str, tmp_path: Path) -> None:
    url = pg_template
    await clear_daily(url)
    db = make_db_engine(url)
    async with make_session_factory(db)() as s, s.begin():
        await s.execute(delete(Swarm))
    await db.dispose()
    env = {**os.environ, "SWARM_DATABASE_URL": url, "SWARM_DAILY_BUDGET_USD": str(CAP),
           "SWARM_SIMULATOR_LATENCY_MS": "5", "SWARM_SIMULATOR_LATENCY_JITTER_MS": "0",
           "SWARM_POLL_INTERVAL_S": "0.1", "SWARM_MAX_RUNNING_SWARMS": "2",
           "SWARM_LEASE_SECONDS": "5", "SWARM_SHUTDOWN_GRACE_S": "0"}
    env.pop("SWARM_GATEWAY_URL", None)
    logs = [open(tmp_path / f"worker{n}.log", "wb") for n in range(2)]
    procs = [subprocess.Popen([str(BIN / "swarm-api"), "worker"], env=env, cwd=tmp_path,
                              stdout=log, stderr=subprocess.STDOUT) for log in logs]
    api, close_api = await start_harness(make_settings(url), run_engine=False)
    try:
        # both workers must be up before the swarms exist, or the first may drive them all
        await until(lambda: all("running" in (tmp_path / f"worker{n}.log").read_text()
                                for n in range(2)), 15, "both workers to run")
        ids = [(await api.post(swarm_body(i))).json()["id"] for i in range(8)]
        runs = await _wait_terminal(api.client, ids, procs)
        ledger, daily, left = await totals(api.app.state.sessions)
        async with api.app.state.sessions() as s:
            owners = set((await s.execute(select(Swarm.lease_owner))).scalars())
    finally:
        await close_api()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p, log in zip(procs, logs, strict=True):
            p.wait(15)
            log.close()
    output = "\n".join((tmp_path / f"worker{n}.log").read_text() for n in range(2))
    assert "Traceback" not in output, output
    assert_capped(runs, ledger, daily)
    assert len(owners) == 2, owners  # both processes drove swarms
    assert left == 0


async def test_a_refusal_by_the_global_cap_tells_no_tenant_what_the_others_spent(
        database_url: str) -> None:
    """The global cap is every tenant's: a refusal by it (a swarm's error, the facade's 429)
    names what the call needs, never what is left — 0.05 minus tenant a's spend, to the
    pico-dollar, which b would read a's activity from (found by a probe session)."""
    a, b = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    h, close = await start_harness(make_settings(database_url, api_keys="a:ka,b:kb",
                                                 daily_budget_usd=Decimal("0.05")))

    async def run(body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        r = await h.post(body, headers=headers)
        assert r.status_code == 202, r.text
        got = await h.client.get(f"/swarms/{r.json()['id']}", params={"wait": 30},
                                 headers=headers)
        data: dict[str, Any] = got.json()
        return data

    try:
        spent = await run({"task": "a's work", "max_tokens": 300,
                           "agents": [{"name": "x"}, {"name": "y"}]}, a)
        assert spent["status"] == "succeeded", spent["error"]
        left = str(Decimal("0.05") - Decimal(spent["usage"]["cost_usd"]))
        big = {"model": "claude-sonnet-4.5", "max_tokens": 100000}
        refused = await run({**big, "task": "b's work", "agents": [{"name": "z"}]}, b)
        assert (refused["status"], refused["error"]["code"]) == (
            "failed", "daily_budget_exceeded")
        seen = repr(refused["error"]) + repr([s["error"] for s in refused["subtasks"]])
        r = await h.client.post("/v1/chat/completions", headers=b, json={
            **big, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 429, r.text
        assert "needs up to" in seen and "needs up to" in r.text
        assert left not in seen and left not in r.text and "left" not in seen, (seen, r.text)
    finally:
        await close()
