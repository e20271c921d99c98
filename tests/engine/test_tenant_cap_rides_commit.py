"""A swarm's calls settle the tenant's daily cap in the group commit that writes their ledger rows
(`TenantDailyCap.settle_with_row`): the cap's own batches only reserve, the tenant's spend is
the ledger's exactly, and once the rows are durable the cap holds nothing of them (with the
global cap beside it too: `BothCaps`). Both databases."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app.db import batches
from app.db.tables import GatewayCall
from app.db.tenant_tables import TenantDailyReservation, TenantDailySpend
from tests.conftest import make_settings, start_harness

BODY = {"task": "t", "synthesis": {"strategy": "concatenate"}, "limits": {"concurrency": 2},
        "agents": [{"name": f"a{i}", "system_prompt": f"[[sim latency_ms={10 * i}]]"}
                   for i in range(4)]}


@pytest.mark.parametrize("global_cap", [None, Decimal(50)], ids=["tenant", "both"])
async def test_calls_settle_in_the_commit_of_their_rows(
        database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        global_cap: Decimal | None) -> None:
    batched: list[tuple[int, int]] = []  # (reservations, settlements) of each cap batch
    apply = batches.apply_tenant_ops

    async def recorded(*args: Any, **kw: Any) -> Any:
        batched.append((len(args[3]), len(args[4])))
        return await apply(*args, **kw)

    monkeypatch.setattr(batches, "apply_tenant_ops", recorded)
    (tmp_path / "tenants.toml").write_text('[defaults]\ndaily_budget_usd = "100"\n')
    h, close = await start_harness(make_settings(
        database_url, tenants_file=str(tmp_path / "tenants.toml"), daily_budget_usd=global_cap))
    try:
        for _ in range(2):
            assert (await h.run(BODY))["status"] == "succeeded"
        assert batched and all(settles == 0 for _, settles in batched), batched
        assert h.app.state.engine.ctx.tenants.held_ids() == []
        async with h.app.state.sessions() as s:
            ledger = (await s.execute(select(func.sum(GatewayCall.cost_usd)))).scalar_one()
            spent = (await s.execute(select(TenantDailySpend.spent_usd).where(
                TenantDailySpend.day == datetime.now(UTC).date()))).scalar_one()
            held = (await s.execute(select(func.count()).select_from(TenantDailyReservation))
                    ).scalar_one()
        assert ledger > 0 and spent == ledger and held == 0
    finally:
        await close()
