"""Durability with real processes on real PostgreSQL (SPEC §4 "Durable", "Takeover is fenced"):
a worker is killed at each crash point, killed from outside mid-call, paused past its lease,
and the database is restarted under it; another worker takes over and the outcome is exact."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.db import changes, columns, leases, writes
from app.db.session import asyncpg_dsn, make_db_engine, make_session_factory
from tests.conftest import make_settings, start_harness
from tests.helpers import UNCAPPED, agent, until
from tests.procs import (
    Db,
    assert_durable_outcome,
    cluster,
    owner_pid,
    post_swarm,
    sim_stats,
    wait_http,
    wait_terminal,
)
from tests.support import PG_BIN, PrivatePostgres, free_port, private_postgres, throwaway_db

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(90)]

CHAIN = {"task": "durability under crashes",
         "agents": [agent("a"), agent("b", depends_on=["a"]), agent("c", depends_on=["b"])],
         "max_tokens": 100}


async def subtask_status(db: Db, swarm_id: str) -> dict[str, str]:
    return {n: s["status"] for n, s in (await db.subtasks(swarm_id)).items()}


@pytest.mark.parametrize("point", ["before_call", "after_response", "after_commit"])
async def test_kill_at_crash_point_then_takeover(db_url: str, tmp_path: Path, point: str) -> None:
    db = Db(db_url)
    async with cluster(db_url, tmp_path) as c:
        sim = await c.simulator(latency_ms=20)
        api, a = await asyncio.gather(c.api(), c.worker("worker_a", SWARM_CRASH_AT=f"{point}:b"))
        swarm_id = (await post_swarm(api, CHAIN))["id"]
        assert await a.wait_exit(20) == -signal.SIGKILL, a.log()

        # the process died exactly where it was told to
        status = await subtask_status(db, swarm_id)
        b_ok = (await sim_stats(sim))["by_key"].get(f"{swarm_id}:b:1", {}).get("ok", 0)
        assert status["a"] == "succeeded" and status["c"] == "pending", status
        if point == "before_call":
            assert b_ok == 0 and status["b"] in ("pending", "running")
        elif point == "after_response":
            assert b_ok == 1 and status["b"] in ("pending", "running")
        else:
            assert b_ok == 1 and status["b"] == "succeeded"
        assert owner_pid(await db.lease_owner(swarm_id)) == a.pid

        b = await c.worker("worker_b")
        await wait_terminal(api, swarm_id, timeout=30)
        row = await db.swarm(swarm_id)
        assert owner_pid(row["lease_owner"]) == b.pid
        # taken over once, and fruitful: `a` had settled in the dead owner's epoch
        assert (row["lease_epoch"], row["rescues"]) == (2, 0)
        # the response-before-commit window: that one answer is asked for again, with the
        # same Idempotency-Key (a deduplicating gateway would answer it from its cache)
        await assert_durable_outcome(db, api, sim, swarm_id,
                                     {"b": 2} if point == "after_response" else None)


@pytest.mark.parametrize("tenants", ["defaults", "uncapped"])
@pytest.mark.parametrize("point", ["before_call", "after_response"])
async def test_a_creator_killed_before_its_first_commit(db_url: str, tmp_path: Path,
                                                      point: str, tenants: str) -> None:
    """A `serve` with its engine claims the swarm as it creates it, and its first call is
    written ahead: by the creation's statement (the first wave: a tenant without admission
    lock or daily cap, "uncapped"), or with SPEC §8's defaults by the engine, its reservation
    in the tenant cap's batch. Killed at `point`, before any commit of its own, it leaves the
    swarm maybe still `queued` with that row in flight. A worker takes it over: the row is
    billed `unknown` at its reservation, the call goes again as attempt 2, and what the
    gateway answered is never more than recorded."""
    db = Db(db_url)
    env = {}
    if tenants == "uncapped":
        (tmp_path / "tenants.toml").write_text(UNCAPPED)
        env["SWARM_TENANTS_FILE"] = str(tmp_path / "tenants.toml")
    async with cluster(db_url, tmp_path, **env) as c:
        sim = await c.simulator(latency_ms=20)
        port = free_port()
        creator = c.spawn("creator", ["serve", "--port", str(port)],
                          SWARM_CRASH_AT=f"{point}:a")
        url = f"http://127.0.0.1:{port}"
        await wait_http(creator, f"{url}/readyz", ok_only=True)
        api = await c.api()
        body = {"task": "killed before its first commit", "max_tokens": 100,
                "agents": [agent("a")], "synthesis": {"strategy": "none"}}
        swarm_id = (await post_swarm(url, body))["id"]
        assert await creator.wait_exit(20) == -signal.SIGKILL, creator.log()
        (ahead,) = await db.ledger(swarm_id)
        assert (ahead["attempt"], ahead["outcome"]) == (1, "in_flight")
        assert owner_pid(await db.lease_owner(swarm_id)) == creator.pid

        await c.worker("worker_b")
        await wait_terminal(api, swarm_id, timeout=30)
        await assert_durable_outcome(db, api, sim, swarm_id,
                                     {"a": 2} if point == "after_response" else None)
        rows = await db.ledger(swarm_id)
        assert [(r["attempt"], r["outcome"]) for r in rows] == [(1, "unknown"), (2, "ok")]
        assert rows[0]["cost_usd"] == rows[0]["reserved_usd"] > 0


async def test_external_kill_while_calls_are_in_flight(db_url: str, tmp_path: Path) -> None:
    db = Db(db_url)
    slow = "[[sim latency_ms=1500]]"
    body = {"task": "killed mid-call", "max_tokens": 100,
            "agents": [agent("p1", slow), agent("p2", slow), agent("p3", slow),
                       agent("after", depends_on=["p1", "p2", "p3"])]}
    async with cluster(db_url, tmp_path) as c:
        sim = await c.simulator(latency_ms=20)
        api, a = await asyncio.gather(c.api(), c.worker("worker_a"))
        swarm_id = (await post_swarm(api, body))["id"]

        async def three_in_flight() -> bool:
            return (await sim_stats(sim))["in_flight"] == 3

        await until(three_in_flight, 15, "three calls in flight")
        a.send(signal.SIGKILL)
        assert await a.wait_exit(5) == -signal.SIGKILL
        assert set((await subtask_status(db, swarm_id)).values()) <= {"pending", "running"}

        b = await c.worker("worker_b")
        await wait_terminal(api, swarm_id, timeout=30)
        assert owner_pid(await db.lease_owner(swarm_id)) == b.pid
        # the calls cut off by the kill were sent again; the gateway answered each once
        # (it saw the dead client go away and never finished those answers)
        stats = (await sim_stats(sim))["by_key"]
        assert [stats[f"{swarm_id}:p{i}:1"]["calls"] for i in (1, 2, 3)] == [2, 2, 2]
        await assert_durable_outcome(db, api, sim, swarm_id)


async def test_crash_loop_fails_internal(db_url: str, tmp_path: Path) -> None:
    db = Db(db_url)
    crash = {"SWARM_CRASH_AT": "before_call:a", "SWARM_MAX_RESCUES": "2"}
    async with cluster(db_url, tmp_path, **crash) as c:
        sim = await c.simulator(latency_ms=20)
        api, first = await asyncio.gather(c.api(), c.worker("worker_1"))
        swarm_id = (await post_swarm(api, CHAIN))["id"]
        assert await first.wait_exit(20) == -signal.SIGKILL
        # two more workers with the same fault: one takes it over and dies too, the next one
        # counts SWARM_MAX_RESCUES fruitless takeovers and fails the swarm instead of calling
        second, third = await asyncio.gather(c.worker("worker_2"), c.worker("worker_3"))
        data = await wait_terminal(api, swarm_id, timeout=30)
        assert data["status"] == "failed"
        assert data["error"]["code"] == "internal", data["error"]
        assert (await db.swarm(swarm_id))["rescues"] == 2
        # each takeover names what its dead owner had in flight: `a`, written ahead
        assert data["error"]["details"]["takeovers"] == [
            {"epoch": 2, "in_flight": ["a"]}, {"epoch": 3, "in_flight": ["a"]}]
        assert [second.alive, third.alive].count(True) == 1  # exactly one more crash
        assert f"{swarm_id}:a:1" not in (await sim_stats(sim))["by_key"]  # never called
        events = await db.events(swarm_id)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert events[-1]["type"] == "swarm.completed"
        assert events[-1]["data"]["status"] == "failed"


async def test_paused_worker_is_fenced_after_takeover(db_url: str, tmp_path: Path) -> None:
    """SIGSTOP a worker past its lease; another takes over; SIGCONT while the other still runs
    the swarm: the paused one commits nothing and says it lost the lease.

    The answers to the paused worker's two calls wait in its sockets: 500s, whose ledger and
    subtask rows go out in one write with no event (so no event key collides to save the day:
    only the fence stops them). Let through, they would duplicate B's ledger rows (same
    Idempotency-Key, same attempt number) and roll the swarm's totals back."""
    db = Db(db_url)
    fail_once = "[[sim latency_ms=1500 fail=500 times=1 retry_after_ms=5000]]"
    body = {"task": "paused worker", "max_tokens": 100,
            "agents": [agent("s1", fail_once), agent("s2", fail_once),
                       agent("late", "[[sim latency_ms=2500]]", depends_on=["s1", "s2"])]}
    async with cluster(db_url, tmp_path) as c:
        sim = await c.simulator(latency_ms=20)
        api, a = await asyncio.gather(c.api(), c.worker("worker_a"))
        swarm_id = (await post_swarm(api, body))["id"]

        async def two_in_flight() -> bool:
            return (await sim_stats(sim))["in_flight"] == 2

        await until(two_in_flight, 15, "two calls in flight")
        a.send(signal.SIGSTOP)
        epoch_a = (await db.swarm(swarm_id))["lease_epoch"]
        b = await c.worker("worker_b")

        async def b_runs_late() -> bool:
            row = await db.swarm(swarm_id)
            subs = await subtask_status(db, swarm_id)
            return owner_pid(row["lease_owner"]) == b.pid and subs["late"] == "running"

        # the lease runs out; if A was paused inside a transaction, PostgreSQL ends that
        # transaction after one lease (it would otherwise keep the row locked from claims)
        await until(b_runs_late, 20, "worker B to take over and run `late`")
        assert (await db.swarm(swarm_id))["lease_epoch"] == epoch_a + 1
        a.send(signal.SIGCONT)
        await a.wait_log("lease lost", timeout=10)
        await wait_terminal(api, swarm_id, timeout=30)
        assert a.alive, "the fenced worker must survive"
        row = await db.swarm(swarm_id)
        assert owner_pid(row["lease_owner"]) == b.pid and row["lease_epoch"] == epoch_a + 1
        await assert_durable_outcome(db, api, sim, swarm_id)
        ledger = [(r["subtask_name"], r["attempt"], r["outcome"])
                  for r in await db.ledger(swarm_id)]
        # A's attempts were written ahead; B settled them as unknown (A's answers never
        # counted) and sent its own as the next attempt, under the same Idempotency-Key
        assert sorted(ledger) == [("@synthesizer", 1, "ok"), ("late", 1, "ok"),
                                  ("s1", 1, "unknown"), ("s1", 2, "ok"),
                                  ("s2", 1, "unknown"), ("s2", 2, "ok")]
        stats = (await sim_stats(sim))["by_key"]
        assert [stats[f"{swarm_id}:{n}:1"]["calls"] for n in ("s1", "s2")] == [2, 2]


@pytest.mark.parametrize("step", ["claim", "heartbeat", "salvage"])
async def test_a_paused_transaction_cannot_keep_a_swarm_locked(db_url: str, step: str) -> None:
    """A process paused inside one of the engine's transactions holds the swarm's row lock,
    and claims skip locked rows; PostgreSQL ends such a transaction after one lease, so the
    swarm can be taken over (the paused process' commit then fails). (The group commit is
    one statement in autocommit: it holds no lock beyond the statement.)"""
    lease = 0.5
    api, close_api = await start_harness(make_settings(db_url), run_engine=False)
    try:  # an API without an engine, in this process: nothing claims the swarm but us
        r = await api.post(CHAIN)
        assert r.status_code == 202, r.text
        swarm_id = r.json()["id"]
    finally:
        await close_api()
    engine = make_db_engine(db_url)
    sessions = make_session_factory(engine)
    paused = sessions()
    try:
        async with sessions() as session, session.begin():
            (claim,) = await leases.claim_swarms(session, "paused", lease, 1)
        async with sessions() as session:
            swarm, _ = (await leases.load_swarms_for_run(session, [swarm_id]))[swarm_id]
        await paused.begin()
        if step == "claim":
            await paused.execute(text("UPDATE swarms SET lease_expires_at = now()"))
            await paused.commit()
            await paused.begin()
            assert await leases.claim_swarms(paused, "paused", lease, 1)
        elif step == "heartbeat":
            assert await leases.extend_leases(paused, "paused", {swarm_id: claim.epoch}, lease)
        else:
            write = changes.SwarmWrite(swarm_id, claim.epoch, {
                col: getattr(swarm, col) for col in columns.SWARM_STATE_COLUMNS})
            assert await writes.apply_spend_only(paused, "paused", write, lease_s=lease)
        locked = "SELECT id FROM swarms WHERE id = $1 FOR UPDATE NOWAIT"
        with pytest.raises(asyncpg.LockNotAvailableError):
            await Db(db_url).fetch(locked, swarm_id)  # held while the transaction lives

        async def unlocked() -> bool:
            with contextlib.suppress(asyncpg.LockNotAvailableError):
                return bool(await Db(db_url).fetch(locked, swarm_id))
            return False

        await until(unlocked, lease + 5, "PostgreSQL to end the idle transaction")
        with pytest.raises(DBAPIError):
            await paused.commit()
    finally:
        with contextlib.suppress(Exception):
            await paused.close()
        await engine.dispose()


@pytest.fixture(scope="module")
def own_server() -> Iterator[PrivatePostgres]:
    """A PostgreSQL server of this module's own: the shared one is never stopped."""
    with private_postgres() as server:
        yield server


@pytest.fixture
def own_db_url(own_server: PrivatePostgres) -> Iterator[str]:
    with throwaway_db("swarm_outage", server=own_server.url) as url:
        yield url


async def _pg_up(url: str) -> bool:
    try:
        conn = await asyncpg.connect(asyncpg_dsn(url), timeout=2)
    except (OSError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True


@pytest.mark.skipif(not PG_BIN, reason="needs PostgreSQL's server binaries (initdb, pg_ctl)")
@pytest.mark.parametrize("outage", ["restart", "down_longer_than_the_lease"])
async def test_database_restart_during_a_run(own_server: PrivatePostgres, own_db_url: str,
                                             tmp_path: Path, outage: str) -> None:
    """PostgreSQL goes away under a running swarm: restarted (about a second), or stopped for
    twice the lease. The worker rides it out: it keeps (or takes back) its own swarm without a
    takeover of itself, nothing runs twice, the swarm succeeds. The server is one of our own
    (`own_server`), so that the shared one, and whatever else uses it, is never disturbed."""
    db_url = own_db_url
    db = Db(db_url)
    step = "[[sim latency_ms=600]]"
    # b's call is in flight through the whole outage; a and d are done before it starts
    body = {"task": "database restart", "max_tokens": 100,
            "agents": [agent("a", step), agent("d", step),
                       agent("b", "[[sim latency_ms=7000]]", depends_on=["a", "d"]),
                       agent("c", step, depends_on=["b"])]}

    async def server_up() -> bool:
        return await _pg_up(db_url)

    try:
        async with cluster(db_url, tmp_path) as c:
            sim = await c.simulator(latency_ms=20)
            api, worker = await asyncio.gather(c.api(), c.worker("worker"))
            swarm_id = (await post_swarm(api, body))["id"]

            async def b_on_the_wire() -> bool:
                # at the gateway, not only `running` in the database: the attempt is written
                # ahead before it is sent, and an outage during that write is not this test's
                stats = await sim_stats(sim)
                return bool(stats["in_flight"] == 1 and f"{swarm_id}:b:1" in stats["by_key"])

            async def b_running() -> bool:  # its start lingers for a commit (LINGER_S)
                return (await subtask_status(db, swarm_id))["b"] == "running"

            await until(b_on_the_wire, 15, "b's call at the gateway")
            await until(b_running, 2, "b's start committed")
            if outage == "restart":
                await asyncio.to_thread(own_server.ctl, "restart")
            else:
                await asyncio.to_thread(own_server.ctl, "stop")
                await asyncio.sleep(4)  # the lease (2 s) runs out while nobody can see it
                await asyncio.to_thread(own_server.ctl, "start")
            await until(server_up, 30, "PostgreSQL to accept connections")
            data = await wait_terminal(api, swarm_id, timeout=40)
            assert data["status"] == "succeeded", data["error"]
            assert worker.alive
            row = await db.swarm(swarm_id)
            assert owner_pid(row["lease_owner"]) == worker.pid
            assert (row["lease_epoch"], row["rescues"]) == (1, 0)  # never taken over
            await assert_durable_outcome(db, api, sim, swarm_id)
    finally:
        if not await server_up():
            await asyncio.to_thread(own_server.ctl, "start")
            await until(server_up, 30, "PostgreSQL to come back")
