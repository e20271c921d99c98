"""The retention period and `swarm-api prune` (SPEC §16), on SQLite and on PostgreSQL: what
ended before the period is erased (per tenant, the global default for the rest), a dry run
counts what a real run erases, ledger rows are pruned only when asked, a sweep runs one at a
time across processes, and a prune racing a retry leaves either a whole copy or a refusal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select, text, update

from app.cli import main
from app.db.session import is_postgres
from app.db.tables import GatewayCall, Swarm
from app.db.types import utcnow
from app.engine.retention import parse_duration
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent, by_name, until

KEYS = {"t1": "k1", "t2": "k2", "t3": "k3"}
FLAKY_400 = "[[sim when=flaky fail=400]]"


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def erased_count(reason: str) -> float:
    return REGISTRY.get_sample_value("swarm_erased_swarms_total", {"reason": reason}) or 0.0


@pytest.fixture
async def tenants(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    """t1 keeps 10 days; t2 (its table laid over the defaults) and t3 (no table) the
    defaults' 2, not the global 30; no sweep round falls due by itself."""
    file = tmp_path / "tenants.toml"
    file.write_text("[defaults]\nretention_days = 2\n[tenants.t1]\nretention_days = 10\n"
                    "[tenants.t2]\nmax_streams = 5\n")
    h, close = await start_harness(make_settings(
        database_url, api_keys=",".join(f"{t}:{k}" for t, k in KEYS.items()),
        tenants_file=str(file), retention_days=30, retention_sweep_s=3600))
    yield h
    await close()


async def ended(h: Harness, tenant: str, n: int = 1) -> list[str]:
    """n swarms of `tenant`, run to their end."""
    ids = []
    for _ in range(n):
        r = await h.client.post("/swarms", json={"task": f"task of {tenant}",
                                                 "agents": [{"name": "a"}]},
                                headers=auth(tenant))
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    for swarm_id in ids:
        await until(lambda i=swarm_id: _terminal(h, i, tenant), 30, "the swarm's end")
    return ids


async def _terminal(h: Harness, swarm_id: str, tenant: str) -> bool:
    status = (await h.client.get(f"/swarms/{swarm_id}", headers=auth(tenant))).json()["status"]
    return bool(status in ("succeeded", "failed", "cancelled"))


async def age(h: Harness, ids: Sequence[str], days: float) -> None:
    """Make the swarms look as if they ended `days` ago."""
    async with h.app.state.sessions() as s, s.begin():
        await s.execute(update(Swarm).where(Swarm.id.in_(ids))
                        .values(finished_at=utcnow() - timedelta(days=days)))


async def erased_ids(h: Harness) -> set[str]:
    async with h.app.state.sessions() as s:
        return set((await s.execute(select(Swarm.id)
                                    .where(Swarm.erased_at.is_not(None)))).scalars())


def test_durations() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("90m") == timedelta(minutes=90)
    assert parse_duration("45s") == timedelta(seconds=45)
    for bad in ("30", "3w", "-1d", "1.5d", "d", "", "30 d"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


@pytest.mark.parametrize("argv", [["prune", "--older-than", "3w"], ["prune"],
                                  ["prune", "--ledger-older-than", "x"]])
def test_prune_refuses_bad_usage_with_exit_2(argv: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "not a duration" in err or "--older-than" in err
    assert "Traceback" not in err


async def test_the_sweep_erases_what_each_tenant_keeps_no_longer(tenants: Harness) -> None:
    h = tenants
    t1 = await ended(h, "t1", 3)
    t2 = await ended(h, "t2", 2)
    t3 = await ended(h, "t3", 2)
    await age(h, [t1[0], t2[0], t3[0]], 11)   # past t1's 10 days and everyone's 2
    await age(h, [t1[1], t2[1], t3[1]], 3)    # past the defaults' 2 days only
    counted = erased_count("retention")
    sweep = h.app.state.retention
    assert await sweep.run_once() == 5
    assert await erased_ids(h) == {t1[0], t2[0], t3[0], t2[1], t3[1]}
    assert erased_count("retention") == counted + 5
    assert await sweep.run_once() == 0  # nothing left: a second round erases nothing
    got = (await h.client.get(f"/swarms/{t1[0]}", headers=auth("t1"))).json()
    assert got["erased"] is True and got["task"] == ""
    kept = (await h.client.get(f"/swarms/{t1[1]}", headers=auth("t1"))).json()
    assert kept["erased"] is False and kept["task"] == "task of t1"


async def test_without_a_period_nothing_is_erased_and_the_loop_runs_by_itself(
        database_url: str) -> None:
    h, close = await start_harness(make_settings(database_url, retention_sweep_s=0.1))
    try:
        one = await h.run({"task": "t", "agents": [{"name": "a"}]})
        await age(h, [one["id"]], 10_000)
        assert await h.app.state.retention.run_once() == 0
        h.app.state.settings.retention_days = 1.5  # the loop reads the rules each round
        await until(lambda: _erased(h, one["id"]), 20, "the sweep's round")
    finally:
        await close()


async def _erased(h: Harness, swarm_id: str) -> bool:
    return bool((await h.client.get(f"/swarms/{swarm_id}")).json()["erased"])


async def test_a_sweep_waits_for_the_other_processes_sweep(tenants: Harness) -> None:
    h = tenants
    if not is_postgres(h.app.state.sessions()):
        pytest.skip("SQLite runs one process")
    ids = await ended(h, "t3", 2)
    await age(h, ids, 5)
    async with h.app.state.db_engine.connect() as other:  # another replica's sweep, running
        await other.execute(text("SELECT pg_advisory_xact_lock(hashtext('swarm-retention'))"))
        assert await h.app.state.retention.run_once() == 0
        await other.rollback()
    assert await h.app.state.retention.run_once() == 2


async def test_prune_dry_run_counts_what_the_real_run_erases(
        tenants: Harness, database_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    h = tenants
    monkeypatch.setenv("SWARM_DATABASE_URL", database_url)
    t1 = await ended(h, "t1", 3)
    t2 = await ended(h, "t2", 2)
    await age(h, t1[:2] + t2[:1], 40)
    await age(h, t1[2:], 20)
    before = await ledger_total(h)

    assert await prune("--older-than", "30d", "--dry-run") == 0
    assert capsys.readouterr().out == "would erase 3 swarms\n"
    assert await erased_ids(h) == set()
    assert await prune("--older-than", "30d", "--tenant", "t1", "--dry-run") == 0
    assert capsys.readouterr().out == "would erase 2 swarms\n"

    assert await prune("--older-than", "30d", "--tenant", "t1") == 0
    assert capsys.readouterr().out == "erased 2 swarms\n"
    assert await erased_ids(h) == set(t1[:2])
    assert await prune("--older-than", "30d") == 0
    assert capsys.readouterr().out == "erased 1 swarms\n"
    assert await erased_ids(h) == set(t1[:2] + t2[:1])
    assert await prune("--older-than", "30d") == 0
    assert capsys.readouterr().out == "erased 0 swarms\n"
    assert await ledger_total(h) == before  # the ledger is money: kept


async def test_prune_removes_ledger_rows_only_when_asked(
        tenants: Harness, database_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    h = tenants
    monkeypatch.setenv("SWARM_DATABASE_URL", database_url)
    old = await ended(h, "t1")
    new = await ended(h, "t2")
    async with h.app.state.sessions() as s, s.begin():
        await s.execute(update(GatewayCall).where(GatewayCall.swarm_id == old[0])
                        .values(created_at=utcnow() - timedelta(days=401)))
        rows = (await s.execute(select(func.count()).select_from(GatewayCall)
                                .where(GatewayCall.swarm_id == old[0]))).scalar_one()
    assert rows > 0
    assert await prune("--ledger-older-than", "400d", "--dry-run") == 0
    assert capsys.readouterr().out == f"would remove {rows} ledger rows\n"
    assert await prune("--ledger-older-than", "400d", "--tenant", "t2") == 0
    assert capsys.readouterr().out == "removed 0 ledger rows\n"
    assert await prune("--ledger-older-than", "400d") == 0
    assert capsys.readouterr().out == f"removed {rows} ledger rows\n"
    async with h.app.state.sessions() as s:
        left = set((await s.execute(select(GatewayCall.swarm_id))).scalars())
    assert left == {new[0]}
    assert await erased_ids(h) == set()  # swarms are not erased by a ledger prune


async def ledger_total(h: Harness) -> Any:
    async with h.app.state.sessions() as s:
        return (await s.execute(select(func.count(), func.sum(GatewayCall.cost_usd))
                                .select_from(GatewayCall))).one()


async def prune(*argv: str) -> int:
    """`swarm-api prune …` as its own event loop (a thread), as the command runs."""
    return await asyncio.to_thread(main, ["prune", *argv])


async def test_prune_racing_a_retry_leaves_a_whole_copy_or_a_refusal(
        tenants: Harness, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    h = tenants
    monkeypatch.setenv("SWARM_DATABASE_URL", database_url)
    flags = h.simulator.state.config.flags
    outcomes: set[int] = set()
    for _ in range(3):
        flags.add("flaky")
        r = await h.client.post("/swarms", headers=auth("t1"), json={
            "task": "the task", "agents": [agent("a", prompt="the prompt of a"),
                                           agent("x", FLAKY_400, depends_on=["a"])]})
        old_id = r.json()["id"]
        await until(lambda i=old_id: _terminal(h, i, "t1"), 30, "the swarm's end")
        old = (await h.client.get(f"/swarms/{old_id}", headers=auth("t1"))).json()
        assert old["status"] == "failed" and by_name(old)["a"]["status"] == "succeeded"
        flags.discard("flaky")
        await age(h, [old_id], 40)
        retried, code = await asyncio.gather(
            h.client.post(f"/swarms/{old_id}/retry", headers=auth("t1")),
            prune("--older-than", "30d", "--tenant", "t1"))
        assert code == 0
        outcomes.add(retried.status_code)
        if retried.status_code == 202:  # the copy was made first: whole, and it stays whole
            new = (await h.client.get(f"/swarms/{retried.json()['id']}",
                                      headers=auth("t1"))).json()
            assert new["erased"] is False and new["task"] == "the task"
            assert by_name(new)["a"]["reused"] is True
            assert by_name(new)["a"]["output"] == by_name(old)["a"]["output"]
        else:  # the erase came first: nothing to copy
            assert retried.status_code == 409, retried.text
            assert retried.json()["error"]["code"] == "swarm_erased"
        assert old_id in await erased_ids(h)
    assert outcomes <= {202, 409}


def test_an_erased_error_keeps_its_code_and_causes_only() -> None:
    from app.db.erase import erased_error

    assert erased_error(None) is None
    assert erased_error({"code": "gateway_rejected", "message": "said: secret prompt",
                         "details": {"status": 400, "body": "secret"}}) == {
        "code": "gateway_rejected", "message": "erased", "details": None}
    assert erased_error({"code": "failure_tolerance_exceeded", "message": "2 of 3 failed",
                         "details": {"causes": {"timeout": 2},
                                     "cause": {"subtask": "a", "message": "secret"}}}) == {
        "code": "failure_tolerance_exceeded", "message": "erased",
        "details": {"causes": {"timeout": 2}}}
