"""Property: whatever the DAG, answers, faults and prices, a swarm's recorded spend never
exceeds its budget and equals its ledger exactly (SPEC §4 "Budget is a hard cap")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from app.db.spend import NOT_BILLED
from app.db.tables import GatewayCall
from tests.conftest import Harness, make_settings, start_harness

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
FAULT = "fail=500 times=1 retry_after=0"
MODELS_TOML = """
[models.m-cheap]
input = 0.10
cached_input = 0.01
output = 0.40

[models.m-pricey]
input = "5.00"
cached_input = "0.50"
output = "20.00"
context_window = 32000
"""


@st.composite
def swarms(draw: st.DrawFn, models: tuple[str, ...], cached: bool) -> dict[str, Any]:
    """A random DAG of agents (edges only to earlier agents, so acyclic) with random answer
    sizes, latencies and one-off faults, under a random budget and concurrency."""
    n = draw(st.integers(2, 12))
    agents = []
    for i in range(n):
        max_tokens = draw(st.integers(50, 2000))
        directives = [f"completion_tokens={draw(st.integers(1, max_tokens))}",
                      f"latency_ms={draw(st.integers(0, 20))}"]
        if cached:
            directives.append(f"cached_tokens={draw(st.integers(0, 40))}")
        if draw(st.integers(0, 9)) == 0:
            directives.append(FAULT)
        deps = draw(st.lists(st.sampled_from([f"a{j}" for j in range(i)]), unique=True,
                             max_size=3)) if i else []
        agents.append({"name": f"a{i}", "system_prompt": f"[[sim {' '.join(directives)}]]",
                       "model": draw(st.sampled_from(models)), "max_tokens": max_tokens,
                       "depends_on": deps})
    budget = draw(st.decimals(Decimal("0.0005"), Decimal("0.05"), places=5))
    return {"task": "property", "agents": agents, "model": models[0], "max_tokens": 300,
            "synthesis": {"strategy": draw(st.sampled_from(["synthesize", "concatenate",
                                                            "none"]))},
            "limits": {"concurrency": draw(st.integers(1, 8)), "budget_usd": str(budget)}}


async def check(h: Harness, body: dict[str, Any]) -> None:
    data = await h.run(body, timeout=60)
    assert data["status"] in ("succeeded", "failed"), data["status"]
    if data["status"] == "failed":
        assert data["error"]["code"] == "budget_exceeded", data["error"]
    spent = Decimal(data["usage"]["cost_usd"])
    assert spent <= Decimal(body["limits"]["budget_usd"])
    async with h.app.state.sessions() as s:
        ledger, calls = (await s.execute(
            select(func.sum(GatewayCall.cost_usd), func.count())
            .where(GatewayCall.swarm_id == data["id"],
                   GatewayCall.outcome.not_in(NOT_BILLED)))).one()
        open_rows = (await s.execute(select(func.count()).where(
            GatewayCall.swarm_id == data["id"], GatewayCall.outcome == "in_flight"))).scalar()
    assert (ledger or Decimal(0)) == spent  # exactly: Decimal sums on both sides
    assert calls == data["usage"]["gateway_calls"]
    assert open_rows == 0  # every attempt written ahead was settled before the end
    assert sum(Decimal(s["usage"]["cost_usd"]) for s in data["subtasks"]) == spent


@PROPERTY
# cheap models drawn more often, so that both outcomes (done within budget, stopped by it) occur
@given(body=swarms(("deepseek-v3.2", "kimi-k2.5", "deepseek-v3.2", "gemini-2.5-flash",
                    "gpt-4.1", "claude-sonnet-4.5"), False))
async def test_spend_never_exceeds_budget_and_matches_ledger(api: Harness,
                                                             body: dict[str, Any]) -> None:
    await check(api, body)


@pytest.fixture
async def custom_prices(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    path = tmp_path / "models.toml"
    path.write_text(MODELS_TOML)
    h, close = await start_harness(make_settings(sqlite_url, models_file=str(path),
                                                 default_model="m-cheap"))
    yield h
    await close()


@PROPERTY
@given(body=swarms(("m-cheap", "m-cheap", "m-pricey"), True))
async def test_custom_prices_with_cached_tokens(custom_prices: Harness,
                                               body: dict[str, Any]) -> None:
    await check(custom_prices, body)
