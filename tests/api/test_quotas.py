"""SPEC §8 tenant quotas at admission, on SQLite and PostgreSQL: the limits file, the token
bucket (429 rate_limited + Retry-After), active swarms and agents (429 quota_exceeded), budgets
(422 over max_budget_usd, default_budget_usd), the tenant daily cap, streams, the metric."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.db.tenant_tables import TenantDailySpend
from app.tenants import TenantLimits, TenantTable
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import assert_rejected, error_of, until
from tests.support import CLI

KEYS = {"a": {"Authorization": "Bearer ka"}, "b": {"Authorization": "Bearer kb"}}
ONE = {"task": "t", "agents": [{"name": "a"}], "synthesis": {"strategy": "none"}}
QUEUED_BODY = {**ONE, "limits": {"budget_usd": "1"}}
TENANTS = """
[defaults]
requests_per_minute = 60
burst = 3
max_active_swarms = 2
max_agents = 3
default_budget_usd = "0.001"
max_budget_usd = "2"
max_streams = 1

[tenants.b]
max_active_swarms = 50
"""

Factory = Callable[..., AsyncIterator[Harness]]


def write(tmp_path: Path, text: str, name: str = "tenants.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


async def harness_with(database_url: str, tmp_path: Path, tenants: str = TENANTS,
                       engine: bool = True, **overrides: Any) -> tuple[Harness, Any]:
    settings = make_settings(database_url, tenants_file=write(tmp_path, tenants),
                             api_keys="a:ka,b:kb", **overrides)
    h, close = await start_harness(settings, run_engine=engine)
    h.client.headers.update(KEYS["a"])  # h.wait() reads as tenant a; post() names its tenant
    return h, close


@pytest.fixture
async def queued(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    """No engine: swarms stay queued (active) until cancelled."""
    h, close = await harness_with(database_url, tmp_path, engine=False)
    yield h
    await close()


async def post(h: Harness, tenant: str, body: dict[str, Any] | None = None,
               **kw: Any) -> httpx.Response:
    return await h.client.post("/swarms", json=body or QUEUED_BODY, headers=KEYS[tenant], **kw)


async def count(h: Harness, tenant: str) -> int:
    r = await h.client.get("/swarms", params={"limit": 200}, headers=KEYS[tenant])
    return len(r.json()["items"])


# ---- the file ------------------------------------------------------------------------------


def test_tenants_file_toml_and_json_merge_over_defaults(tmp_path: Path) -> None:
    table = TenantTable.from_file(write(tmp_path, TENANTS))
    b = table.limits("b")
    assert b.max_active_swarms == 50 and b.burst == 3
    assert b.max_streams == 1 and b.default_budget_usd == Decimal("0.001")  # from [defaults]
    assert table.limits("nobody") == table.defaults
    same = TenantTable.from_file(write(tmp_path, json.dumps({
        "defaults": {"requests_per_minute": 60, "burst": 3, "max_active_swarms": 2,
                     "max_agents": 3, "default_budget_usd": "0.001", "max_budget_usd": "2",
                     "max_streams": 1},
        "tenants": {"b": {"max_active_swarms": 50}}}), "t.json"))
    assert same.version == table.version and same.limits("b") == b
    secret = TenantTable.from_file(write(tmp_path, '[tenants.c]\nwebhook_secret = "s3"\n'))
    assert secret.limits("c").webhook_secret is not None
    assert secret.limits("c").webhook_secret.get_secret_value() == "s3"
    assert "s3" not in repr(secret.limits("c"))
    assert secret.version != TenantTable.from_file(
        write(tmp_path, '[tenants.c]\nwebhook_secret = "s4"\n')).version
    # with a file, an absent key is no limit; without one, SPEC §8's defaults
    assert TenantTable.from_file(write(tmp_path, "")).limits("x") == TenantLimits()
    assert TenantTable.builtin().limits("x").requests_per_minute == 600


@pytest.mark.parametrize(("text", "says"), [
    ("[defaults]\nburst = 0\n", "[defaults] burst"),
    ("[defaults]\nmax_budget_usd = \"-1\"\n", "max_budget_usd"),
    ("[defaults]\nrequests_per_minute = \"lots\"\n", "requests_per_minute"),
    ("[defaults]\nmax_stream = 5\n", "max_stream"),
    ("[tenants.x]\nmax_budget_usd = \"1\"\ndefault_budget_usd = \"5\"\n",
     "default_budget_usd is above max_budget_usd"),
    ("[other]\n", "expected only [defaults]"),
    ("[defaults\n", "tenants.toml"),
])
def test_a_bad_tenants_file_is_refused_with_the_reason(tmp_path: Path, text: str,
                                                       says: str) -> None:
    with pytest.raises(ValueError, match="SWARM_TENANTS_FILE") as exc:
        TenantTable.from_file(write(tmp_path, text))
    assert says in str(exc.value)


def test_serve_with_a_bad_tenants_file_stops_with_a_clear_message(tmp_path: Path) -> None:
    path = write(tmp_path, "[defaults]\nburst = -2\n")
    run = subprocess.run([CLI, "serve", "--port", "9"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path,
                         env={"SWARM_TENANTS_FILE": path, "PATH": "/usr/bin:/bin"})
    assert run.returncode == 2
    assert "SWARM_TENANTS_FILE" in run.stderr and "burst" in run.stderr
    assert "Traceback" not in run.stderr


async def test_readyz_shows_the_tenants_version(queued: Harness, tmp_path: Path) -> None:
    ready = (await queued.client.get("/readyz")).json()
    assert ready["tenants_version"] == TenantTable.from_file(write(tmp_path, TENANTS)).version


# ---- admission -----------------------------------------------------------------------------


async def test_burst_over_the_bucket_is_rate_limited_then_admitted_again(
        queued: Harness) -> None:
    h = queued
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    answers = await asyncio.gather(*(post(h, "b") for _ in range(8)))
    elapsed = loop.time() - t0
    admitted = [r for r in answers if r.status_code == 202]
    # a bucket of 3 refilled at one a second
    assert 3 <= len(admitted) <= 3 + int(elapsed) + 1, (len(admitted), elapsed)
    refused = [r for r in answers if r.status_code != 202]
    assert refused, "nothing refused"
    for r in refused:
        err = error_of(r, 429, "rate_limited")
        assert err["details"]["limit"] == "requests_per_minute"
        assert r.headers["retry-after"] == "1"
    assert await count(h, "b") == len(admitted)  # nothing stored for a refusal
    assert (await post(h, "a")).status_code == 202  # another tenant's bucket is its own
    await asyncio.sleep(int(refused[-1].headers["retry-after"]))
    assert (await post(h, "b")).status_code == 202


async def test_the_n_plus_first_active_swarm_is_refused(queued: Harness) -> None:
    h = queued
    ids = [(await post(h, "a")).json()["id"] for _ in range(2)]
    r = await post(h, "a")
    err = error_of(r, 429, "quota_exceeded")
    assert err["details"]["limit"] == "max_active_swarms"
    assert (err["details"]["count"], err["details"]["max"]) == (2, 2)
    assert int(r.headers["retry-after"]) >= 1
    assert await count(h, "a") == 2
    # once one is cancelled, the next is admitted (the refusal did not keep its token)
    await h.client.post(f"/swarms/{ids[0]}/cancel", headers=KEYS["a"])
    assert (await post(h, "a")).status_code == 202


async def test_replay_is_answered_at_the_active_limit(queued: Harness) -> None:
    h = queued
    headers = {"Idempotency-Key": "same", **KEYS["a"]}
    first = await h.client.post("/swarms", json=QUEUED_BODY, headers=headers)
    await post(h, "a")
    again = await h.client.post("/swarms", json=QUEUED_BODY, headers=headers)
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"]


async def test_agents_and_budget_quotas(queued: Harness) -> None:
    h = queued
    many = {"task": "t", "agents": [{"name": f"a{i}"} for i in range(4)]}
    err = error_of(await post(h, "a", many), 429, "quota_exceeded")
    assert err["details"]["limit"] == "max_agents" and err["details"]["max"] == 3
    planned = {"task": "t", "orchestrator": {"max_subtasks": 4}}
    err = error_of(await post(h, "a", planned), 429, "quota_exceeded")
    assert err["details"]["field"] == "orchestrator.max_subtasks"
    # a planned swarm that names no size gets one within the quota
    spec = (await post(h, "a", {"task": "t"})).json()["spec"]
    assert spec["orchestrator"]["max_subtasks"] == 3
    err = error_of(await post(h, "b", {**ONE, "limits": {"budget_usd": "2.01"}}), 422,
                   "budget_too_large")
    assert err["details"]["field"] == "limits.budget_usd"
    assert err["details"]["limit"] == "max_budget_usd"
    assert await count(h, "b") == 0
    ok = await post(h, "b", {**ONE, "limits": {"budget_usd": "2"}})
    assert Decimal(ok.json()["spec"]["limits"]["budget_usd"]) == 2


async def test_a_swarm_without_a_budget_runs_with_the_default(database_url: str,
                                                               tmp_path: Path) -> None:
    h, close = await harness_with(database_url, tmp_path)
    try:
        # one call's worst case (1500 output tokens at 2.50/1M) is above 0.001: refused
        r = await post(h, "a", ONE)
        assert r.status_code == 202, r.text
        assert Decimal(r.json()["spec"]["limits"]["budget_usd"]) == Decimal("0.001")
        data = await h.wait(r.json()["id"])
        assert data["status"] == "failed" and data["error"]["code"] == "budget_exceeded"
        # a call that fits in the default runs
        small = {**ONE, "max_tokens": 100}
        r = await post(h, "a", small)
        data = await h.wait(r.json()["id"])
        assert data["status"] == "succeeded", data["error"]
        assert Decimal(data["usage"]["cost_usd"]) <= Decimal("0.001")
    finally:
        await close()


async def test_a_spent_tenant_day_is_refused_at_admission(database_url: str,
                                                          tmp_path: Path) -> None:
    h, close = await harness_with(database_url, tmp_path,
                                  TENANTS + '\n[tenants.a]\ndaily_budget_usd = "0.5"\n',
                                  engine=False)
    try:
        async with h.app.state.sessions() as s, s.begin():
            s.add(TenantDailySpend(tenant="a", day=datetime.now(UTC).date(),
                                   spent_usd=Decimal("0.5")))
        r = await post(h, "a")
        err = error_of(r, 429, "quota_exceeded")
        assert err["details"]["limit"] == "daily_budget_usd"
        assert Decimal(err["details"]["spent"]) == Decimal(err["details"]["max"]) \
            == Decimal("0.5")
        assert 1 <= int(r.headers["retry-after"]) <= 86_400  # the next UTC day
        assert (await post(h, "b")).status_code == 202
    finally:
        await close()


async def test_the_tenant_daily_cap_fails_a_swarm_with_scope_tenant(database_url: str,
                                                                     tmp_path: Path) -> None:
    tenants = '[tenants.a]\ndaily_budget_usd = "0.004"\n'
    h, close = await harness_with(database_url, tmp_path, tenants)
    try:
        # each call costs about 0.0025 (1000 output tokens); the second cannot fit
        step = "[[sim completion_tokens=1000]]"
        body = {"task": "t", "max_tokens": 1000, "synthesis": {"strategy": "none"},
                "agents": [{"name": "x", "system_prompt": step},
                           {"name": "y", "system_prompt": step, "depends_on": ["x"]}]}
        r = await post(h, "a", body)
        data = await h.wait(r.json()["id"])
        assert data["status"] == "failed", data
        assert data["error"]["code"] == "daily_budget_exceeded"
        assert data["error"]["details"]["scope"] == "tenant"
        assert Decimal(data["usage"]["cost_usd"]) <= Decimal("0.004")
        # tenant b has no cap of its own: the same swarm runs
        r = await post(h, "b", body)
        h.client.headers.update(KEYS["b"])
        data = await h.wait(r.json()["id"])
        assert data["status"] == "succeeded", data["error"]
    finally:
        await close()


# ---- streams and the metric ----------------------------------------------------------------


async def test_streams_per_tenant(queued: Harness) -> None:
    h = queued
    swarm_id = (await post(h, "a")).json()["id"]
    held = asyncio.create_task(h.client.get(f"/swarms/{swarm_id}", params={"wait": 2},
                                            headers=KEYS["a"]))
    await until(lambda: h.app.state.stream_slots.open.get("a"), 2, "a's held stream",
                every=0.01)
    r = await h.client.get(f"/swarms/{swarm_id}", params={"wait": 1}, headers=KEYS["a"])
    assert error_of(r, 429, "quota_exceeded")["details"]["limit"] == "max_streams"
    assert r.headers["retry-after"] == "1"
    r = await h.client.get(f"/swarms/{swarm_id}/events", headers=KEYS["a"])
    assert error_of(r, 429, "quota_exceeded")["details"]["limit"] == "max_streams"
    # a plain read holds nothing; another tenant has its own slots
    assert (await h.client.get(f"/swarms/{swarm_id}", headers=KEYS["a"])).status_code == 200
    b_id = (await post(h, "b")).json()["id"]
    r = await h.client.get(f"/swarms/{b_id}", params={"wait": 0.1}, headers=KEYS["b"])
    assert r.status_code == 200
    assert (await held).status_code == 200
    assert "a" not in h.app.state.stream_slots.open  # released
    # a finished stream gives its slot back too
    await h.client.post(f"/swarms/{swarm_id}/cancel", headers=KEYS["a"])
    r = await h.client.get(f"/swarms/{swarm_id}/events", headers=KEYS["a"])
    assert r.status_code == 200 and "swarm.completed" in r.text
    assert "a" not in h.app.state.stream_slots.open


async def test_quota_denials_metric(queued: Harness) -> None:
    def value(text: str, limit: str) -> float:
        line = f'swarm_quota_denials_total{{limit="{limit}"}} '
        return float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1])

    before = (await queued.client.get("/metrics")).text
    for limit in ("requests_per_minute", "max_active_swarms", "max_agents", "max_budget_usd",
                  "daily_budget_usd", "max_streams"):
        value(before, limit)  # exposed from the start
    assert "tenant=" not in "".join(x for x in before.splitlines()
                                    if x.startswith("swarm_quota_denials_total"))
    for _ in range(3):
        await post(queued, "a")
    after = (await queued.client.get("/metrics")).text
    assert value(after, "max_active_swarms") == value(before, "max_active_swarms") + 1


async def test_a_tenants_calls_in_flight_are_bounded_per_process(sqlite_url: str,
                                                                 tmp_path: Path) -> None:
    h, close = await harness_with(sqlite_url, tmp_path, "[tenants.a]\nmax_inflight_calls = 2\n")
    try:
        body = {"task": "t", "synthesis": {"strategy": "none"}, "limits": {"concurrency": 6},
                "agents": [{"name": f"a{i}", "system_prompt": "[[sim latency_ms=60]]"}
                           for i in range(6)]}
        ids = [(await post(h, "a", body)).json()["id"] for _ in range(2)]
        for swarm_id in ids:
            assert (await h.wait(swarm_id))["status"] == "succeeded"
        assert (await h.stats())["max_in_flight"] == 2  # two swarms of 6: saturated at 2
        # another tenant is not held by a's limit
        h.client.headers.update(KEYS["b"])
        data = await h.wait((await post(h, "b", body)).json()["id"])
        assert data["status"] == "succeeded"
        assert (await h.stats())["max_in_flight_by_swarm"][data["id"]] == 6
    finally:
        await close()


async def test_a_retry_is_a_new_swarm_within_the_quotas(database_url: str,
                                                       tmp_path: Path) -> None:
    h, close = await harness_with(database_url, tmp_path, TENANTS + "[tenants.a]\nburst = 10\n",
                                  engine=False)
    try:
        old = (await post(h, "a")).json()["id"]
        await h.client.post(f"/swarms/{old}/cancel", headers=KEYS["a"])
        r = await h.client.post(f"/swarms/{old}/retry", json={"limits": {"budget_usd": "5"}},
                                headers=KEYS["a"])
        assert error_of(r, 422, "budget_too_large")["details"]["field"] == "limits.budget_usd"
        r = await h.client.post(f"/swarms/{old}/retry", headers=KEYS["a"])
        assert r.status_code == 202, r.text
        assert (await post(h, "a")).status_code == 202  # two active now: the limit
        r = await h.client.post(f"/swarms/{old}/retry", headers=KEYS["a"])
        assert error_of(r, 429, "quota_exceeded")["details"]["limit"] == "max_active_swarms"
    finally:
        await close()


async def test_a_retry_cannot_drop_the_budget(queued: Harness) -> None:
    """`budget_usd: null` would run the new swarm with no budget, past `max_budget_usd` and
    `default_budget_usd`: refused, naming the field; left out, the old run's budget holds."""
    h = queued
    old = (await post(h, "a", ONE)).json()["id"]
    await h.client.post(f"/swarms/{old}/cancel", headers=KEYS["a"])
    r = await h.client.post(f"/swarms/{old}/retry", json={"limits": {"budget_usd": None}},
                            headers=KEYS["a"])
    assert_rejected(r, 422, "validation_error", "limits.budget_usd")
    assert await count(h, "a") == 1
    r = await h.client.post(f"/swarms/{old}/retry", json={"limits": {"concurrency": 2}},
                            headers=KEYS["a"])
    assert r.status_code == 202, r.text
    assert Decimal(r.json()["spec"]["limits"]["budget_usd"]) == Decimal("0.001")  # the default
