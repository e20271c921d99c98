"""Property: whatever the tenants, prices and swarms running at once, no tenant's recorded
daily spend exceeds its own cap, the global cap holds over everyone, and both tables equal the
ledger exactly (SPEC §8 "A tenant's daily cap is enforced like the global one")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, func, select

from app.db.tables import DailyReservation, DailySpend, Event, GatewayCall, Subtask, Swarm
from app.db.tenant_tables import TenantBucket, TenantDailyReservation, TenantDailySpend
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import MODELS_TOML

GLOBAL_CAP = Decimal("0.05")
CAPS = {"t1": Decimal("0.006"), "t2": Decimal("0.02"), "t3": None}  # t3: only the global cap
TENANTS = """
[tenants.t1]
daily_budget_usd = "0.006"

[tenants.t2]
daily_budget_usd = "0.02"
"""
PROPERTY = settings(max_examples=10, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    """2-4 swarms of random tenants, each a fan-out of 1-6 agents of random prices, sizes
    and latencies."""
    out = []
    for _ in range(draw(st.integers(2, 4))):
        agents = []
        for i in range(draw(st.integers(1, 6))):
            max_tokens = draw(st.integers(50, 1000))
            agents.append({
                "name": f"a{i}", "model": draw(st.sampled_from(["m-cheap", "m-pricey"])),
                "max_tokens": max_tokens,
                "system_prompt": f"[[sim completion_tokens={draw(st.integers(1, max_tokens))} "
                                 f"latency_ms={draw(st.integers(0, 30))}]]"})
        out.append((draw(st.sampled_from(sorted(CAPS))),
                    {"task": "cap", "agents": agents, "synthesis": {"strategy": "none"},
                     "limits": {"concurrency": draw(st.integers(1, 6))}}))
    return out


@pytest.fixture
async def capped(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    """Both backends: PostgreSQL batches the tenant cap in its own statements."""
    (tmp_path / "models.toml").write_text(MODELS_TOML)
    (tmp_path / "tenants.toml").write_text(TENANTS)
    h, close = await start_harness(make_settings(
        database_url, models_file=str(tmp_path / "models.toml"),
        tenants_file=str(tmp_path / "tenants.toml"), daily_budget_usd=GLOBAL_CAP,
        default_model="m-cheap",
        api_keys="t1:k1,t2:k2,t3:k3"))
    yield h
    await close()


async def _reset(h: Harness) -> None:
    """A new day for the next example: no swarms, no spend, no reservations."""
    async with h.app.state.sessions() as s, s.begin():
        for table in (GatewayCall, Event, Subtask, Swarm, DailySpend, DailyReservation,
                      TenantDailySpend, TenantDailyReservation, TenantBucket):
            await s.execute(delete(table))


async def _run(h: Harness, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer k{tenant[1]}"}
    r = await h.client.post("/swarms", json=body, headers=headers)
    assert r.status_code == 202, r.text
    swarm_id = r.json()["id"]
    while True:
        got = await h.client.get(f"/swarms/{swarm_id}", params={"wait": 10}, headers=headers)
        data: dict[str, Any] = got.json()
        if data["status"] in ("succeeded", "failed", "cancelled"):
            return data


@PROPERTY
@given(work=workloads())
async def test_no_tenant_spends_past_its_cap(capped: Harness,
                                             work: list[tuple[str, dict[str, Any]]]) -> None:
    h = capped
    await _reset(h)
    done = await asyncio.gather(*(_run(h, tenant, body) for tenant, body in work))
    for (tenant, _), data in zip(work, done, strict=True):
        assert data["status"] in ("succeeded", "failed"), data
        if data["status"] == "failed":
            err = data["error"]
            assert err["code"] == "daily_budget_exceeded", err
            if (err["details"] or {}).get("scope") == "tenant":
                assert CAPS[tenant] is not None  # only a tenant with a cap is stopped by one
    day = datetime.now(UTC).date()
    async with h.app.state.sessions() as s:
        ledger = dict((await s.execute(
            select(GatewayCall.tenant, func.sum(GatewayCall.cost_usd))
            .group_by(GatewayCall.tenant))).all())
        recorded = dict((await s.execute(
            select(TenantDailySpend.tenant, TenantDailySpend.spent_usd)
            .where(TenantDailySpend.day == day))).all())
        total = (await s.execute(select(DailySpend.spent_usd)
                                 .where(DailySpend.day == day))).scalar_one_or_none()
    for tenant, cap in CAPS.items():
        spent = ledger.get(tenant) or Decimal(0)
        if cap is not None:
            assert spent <= cap, (tenant, spent, cap)
            assert recorded.get(tenant, Decimal(0)) == spent  # exactly the ledger
    everyone = sum((v or Decimal(0) for v in ledger.values()), Decimal(0))
    assert everyone <= GLOBAL_CAP
    assert (total or Decimal(0)) == everyone
