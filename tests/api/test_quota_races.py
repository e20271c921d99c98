"""Tenant quotas under concurrent requests, on both backends (`database_url`).

SPEC §8: "Over a rate or count limit -> 429 ... code `quota_exceeded` ... Nothing is stored for a
refused request": however many requests arrive at once, `max_active_swarms` is never exceeded
by any route that creates a swarm (§3 `POST /swarms`, §11 `POST /swarms/{id}/retry`, §10 the
facade's `agent_swarm`), with or without a token bucket (`requests_per_minute`).
SPEC §11: "`Idempotency-Key` works as on `POST /swarms`": a replay creates nothing, so it is
answered whatever the quotas say.
SPEC §3: a missing or wrong key is a 401, whatever the body (as on `POST /swarms`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, text

from app.db.tables import Swarm
from app.simulator import SimulatorConfig
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import error_of, until

ONE = {"task": "t", "agents": [{"name": "a"}], "synthesis": {"strategy": "none"},
       "limits": {"budget_usd": "1"}}
FACADE = {"model": "kimi-k2.5", "messages": [{"role": "user", "content": "t"}],
          "agent_swarm": {"enabled": True}}
LIMIT = "[defaults]\nmax_active_swarms = 2\n"
FACADE_MS = 5000  # an admitted agent_swarm answers after its swarm: later than any refusal
LIMIT_AND_BUCKET = ("[defaults]\nrequests_per_minute = 60000\nburst = 1000\n"
                    "max_active_swarms = 2\n")


async def harness(url: str, tmp_path: Path, tenants: str, engine: bool = True,
                  sim: SimulatorConfig | None = None, **kw: Any) -> tuple[Harness, Any]:
    path = tmp_path / "tenants.toml"
    path.write_text(tenants)
    return await start_harness(make_settings(url, tenants_file=str(path), **kw), sim,
                               run_engine=engine)


async def stored(h: Harness) -> int:
    async with h.app.state.sessions() as s:
        return int((await s.execute(select(func.count()).select_from(Swarm))).scalar_one())


def assert_at_most_two(answers: list[httpx.Response]) -> None:
    codes = Counter(r.status_code for r in answers)
    assert set(codes) <= {202, 429}, [r.text for r in answers if r.status_code not in (202, 429)]
    assert codes[202] <= 2, codes
    for r in answers:
        if r.status_code == 429:
            assert error_of(r, 429, "quota_exceeded")["details"]["limit"] == "max_active_swarms"
            assert int(r.headers["Retry-After"]) >= 1


async def cancelled_swarm(h: Harness) -> str:
    old: str = (await h.post(ONE)).json()["id"]
    assert (await h.client.post(f"/swarms/{old}/cancel")).status_code == 202
    return old


# ---- POST /swarms -----------------------------------------------------------------------------


@pytest.mark.parametrize("tenants", [LIMIT, LIMIT_AND_BUCKET], ids=["no-bucket", "bucket"])
async def test_concurrent_creations_stay_within_max_active_swarms(
        database_url: str, tmp_path: Path, tenants: str) -> None:
    """With a bucket its row lock serialises the count; without one (no row to lock) the
    count holds a per-tenant lock of its own (PostgreSQL)."""
    h, close = await harness(database_url, tmp_path, tenants, engine=False)
    try:
        answers = await asyncio.gather(*(h.post(ONE) for _ in range(20)))
        assert_at_most_two(answers)
        assert await stored(h) == 2
    finally:
        await close()


# ---- POST /swarms/{id}/retry ------------------------------------------------------------------


async def test_concurrent_retries_stay_within_max_active_swarms(
        database_url: str, tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path, LIMIT, engine=False)
    try:
        old = await cancelled_swarm(h)
        answers = await asyncio.gather(*(h.client.post(f"/swarms/{old}/retry")
                                         for _ in range(20)))
        assert_at_most_two(answers)
        assert await stored(h) == 1 + 2
    finally:
        await close()


async def test_concurrent_retries_with_a_bucket_stay_within_max_active_swarms(
        database_url: str, tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path, LIMIT_AND_BUCKET, engine=False)
    try:
        old = await cancelled_swarm(h)
        answers = await asyncio.gather(*(h.client.post(f"/swarms/{old}/retry")
                                         for _ in range(10)), *(h.post(ONE) for _ in range(10)))
        assert_at_most_two(answers)
        assert await stored(h) == 1 + 2
    finally:
        await close()


async def test_a_replayed_retry_is_answered_over_the_quota(database_url: str,
                                                           tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path, LIMIT, engine=False)
    try:
        old = await cancelled_swarm(h)
        key = {"Idempotency-Key": "r"}
        first = await h.client.post(f"/swarms/{old}/retry", headers=key)
        assert first.status_code == 202, first.text
        assert (await h.post(ONE)).status_code == 202  # the tenant's 2 active swarms
        error_of(await h.client.post(f"/swarms/{old}/retry"), 429, "quota_exceeded")
        again = await h.client.post(f"/swarms/{old}/retry", headers=key)
        assert again.status_code == 202, again.text
        assert again.json()["id"] == first.json()["id"]
        assert await stored(h) == 3
    finally:
        await close()


async def test_a_retry_without_a_valid_key_is_401_whatever_its_body(
        database_url: str, tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path, "", engine=False, api_keys="t1:k1")
    try:
        old = "00000000-0000-0000-0000-000000000000"
        json_type = {"Content-Type": "application/json"}
        for auth in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic a2E="}):
            for body in (b"{not json", b'{"limits": {"colour": 1}}', b""):
                r = await h.client.post(f"/swarms/{old}/retry", content=body,
                                        headers={**json_type, **auth})
                error_of(r, 401, "unauthorized")
        ok = {**json_type, "Authorization": "Bearer k1"}
        error_of(await h.client.post(f"/swarms/{old}/retry", content=b"{not json",
                                     headers=ok), 400, "invalid_json")
        error_of(await h.client.post(f"/swarms/{old}/retry", headers=ok), 404, "not_found")
    finally:
        await close()


# ---- the facade's agent_swarm -----------------------------------------------------------------


async def _facade_race(h: Harness, creations: int) -> None:
    """10 agent_swarm requests (they wait for their swarm: 5 s) and `creations` POSTs at once:
    the refused ones answer 429 long before an admitted one could answer (waited for up to 4 s:
    a loaded host answers late, never wrongly), and at most 2 swarms are stored."""
    tasks = [asyncio.create_task(h.client.post("/v1/chat/completions", json=FACADE,
                                               timeout=30)) for _ in range(10)]
    try:
        posts = await asyncio.gather(*(h.post(ONE) for _ in range(creations)))
        posts_refused = sum(r.status_code == 429 for r in posts)
        await until(lambda: sum(t.done() for t in tasks) + posts_refused >= 8 + creations, 4.0,
                    "the refusals")
        created = await stored(h)
        refused = [t.result() for t in tasks if t.done()]
        assert all(r.status_code == 429 for r in refused), [r.text for r in refused]
        for r in refused:
            assert r.json()["error"]["code"] == "quota_exceeded", r.text
        assert {r.status_code for r in posts} <= {202, 429}
        assert created <= 2, (created, len(refused))
        assert len(refused) + posts_refused >= 8 + creations
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_concurrent_facade_swarms_stay_within_max_active_swarms(
        database_url: str, tmp_path: Path) -> None:
    h, close = await harness(database_url, tmp_path, LIMIT,
                             sim=SimulatorConfig(latency_ms=FACADE_MS))
    try:
        await _facade_race(h, 0)
    finally:
        await close()


async def test_facade_swarms_and_creations_with_a_bucket_stay_within_max_active_swarms(
        database_url: str, tmp_path: Path) -> None:
    """The facade's token is taken before its insert; its count then waits on the bucket's
    row, as POST /swarms' does."""
    h, close = await harness(database_url, tmp_path, LIMIT_AND_BUCKET,
                             sim=SimulatorConfig(latency_ms=FACADE_MS))
    try:
        await _facade_race(h, 10)
    finally:
        await close()


# ---- at the limit while swarms end -----------------------------------------------------------


COUNTED = ("SELECT count(*) FROM swarms WHERE status IN ('queued', 'awaiting_approval', "
           "'planning', 'running', 'synthesizing')")


@pytest.mark.parametrize("tenants", [LIMIT, LIMIT_AND_BUCKET], ids=["no-bucket", "bucket"])
async def test_creations_at_the_limit_while_swarms_end_never_pass_it(
        pg_url: str, tmp_path: Path, tenants: str) -> None:
    """PostgreSQL: many parallel POSTs at `max_active_swarms` while the engine ends swarms (the
    trigger-kept counts go down in the group commits as creations read them, migration 0024):
    the active swarms, sampled throughout in one statement each, never pass the limit, some
    are admitted as others end, and the kept count is back at 0 once all have ended."""
    h, close = await harness(pg_url, tmp_path, tenants, sim=SimulatorConfig(latency_ms=30),
                             poll_interval_s=0.05)
    samples: list[int] = []
    posting = True

    async def sample() -> None:
        while posting:
            async with h.app.state.sessions() as s:
                samples.append(int((await s.execute(text(COUNTED))).scalar_one()))
            await asyncio.sleep(0.005)

    try:
        sampler = asyncio.create_task(sample())
        answers: list[httpx.Response] = []
        for _ in range(6):  # waves: each meets the swarms the last one admitted, ending
            answers += await asyncio.gather(*(h.post(ONE) for _ in range(25)))
            await asyncio.sleep(0.05)
        posting = False
        await sampler
        codes = Counter(r.status_code for r in answers)
        assert set(codes) == {202, 429}, codes
        assert codes[202] > 2, codes  # admitted again as swarms ended
        assert samples and max(samples) <= 2, Counter(samples)
        for r in answers:
            if r.status_code == 202:
                await h.wait(r.json()["id"])
        async with h.app.state.sessions() as s:
            kept = (await s.execute(text("SELECT coalesce(sum(active), 0) FROM tenant_active"))
                    ).scalar_one()
            assert (int(kept), (await s.execute(text(COUNTED))).scalar_one()) == (0, 0)
    finally:
        posting = False
        await close()
