"""A gateway whose answers claim more tokens than the request allows — a million completion
tokens for `max_tokens: 50`, or a count no column holds — is billed the request's bounds: the
swarm's budget and the shared daily cap stay hard, the swarm is not wedged by a write that
cannot be stored, and another tenant's swarm is untouched (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from app.pricing import PriceTable
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent, by_name

KEYS = {"alpha": "key-alpha", "beta": "key-beta"}
MAX_TOKENS = 50
BUDGET = Decimal("0.05")


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


@pytest.fixture
async def two_tenants(database_url: str) -> AsyncIterator[Harness]:
    keys = ",".join(f"{t}:{k}" for t, k in KEYS.items())
    # a day's cap one over-reported answer would have spent (2.50 USD a million tokens)
    h, close = await start_harness(make_settings(database_url, api_keys=keys,
                                                 daily_budget_usd=Decimal("1")))
    yield h
    await close()


async def run(h: Harness, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await h.post(body, headers=auth(tenant))
    assert r.status_code == 202, r.text
    swarm_id = r.json()["id"]
    for _ in range(6):
        r = await h.client.get(f"/swarms/{swarm_id}", params={"wait": 10}, headers=auth(tenant))
        data: dict[str, Any] = r.json()
        if data["status"] in ("succeeded", "failed", "cancelled"):
            return data
    raise AssertionError(f"swarm {swarm_id} still {data['status']} after 60 s")


async def spent(h: Harness, tenant: str) -> Decimal:
    r = await h.client.get("/usage", headers=auth(tenant))
    return Decimal(r.json()["total"]["cost_usd"])


async def test_over_reported_usage_is_billed_the_requests_bounds(two_tenants: Harness) -> None:
    h = two_tenants
    liar = {"task": "t", "max_tokens": MAX_TOKENS, "synthesis": {"strategy": "concatenate"},
            "limits": {"budget_usd": str(BUDGET)},
            "agents": [agent("million", "[[sim completion_tokens=1000000]]"),
                       agent("absurd", f"[[sim completion_tokens={10**20}]]"),
                       agent("prompt", "[[sim prompt_tokens=5000000]]"),
                       agent("honest")]}
    clean = {"task": "the other tenant's work", "max_tokens": MAX_TOKENS,
             "agents": [agent(f"c{i}") for i in range(8)], "limits": {"concurrency": 8}}
    beta = await run(h, "beta", liar)
    alpha = await run(h, "alpha", clean)

    assert beta["status"] == "succeeded", beta["error"]
    assert alpha["status"] == "succeeded", alpha["error"]
    price = PriceTable.builtin()["kimi-k2.5"]
    subs = by_name(beta)
    for name in ("million", "absurd"):
        usage = subs[name]["usage"]
        assert usage["completion_tokens"] == MAX_TOKENS, (name, usage)
        assert Decimal(usage["cost_usd"]) == price.cost(usage["prompt_tokens"], MAX_TOKENS)
    # the prompt's bound: its bytes (plus overheads), far under the five million claimed
    assert 0 < subs["prompt"]["usage"]["prompt_tokens"] < 2_000
    assert subs["honest"]["usage"]["completion_tokens"] <= MAX_TOKENS
    assert Decimal(beta["usage"]["cost_usd"]) <= BUDGET
    # the ledger holds what the swarms hold, tenant by tenant, within the day's cap
    assert await spent(h, "beta") == Decimal(beta["usage"]["cost_usd"])
    assert await spent(h, "alpha") == Decimal(alpha["usage"]["cost_usd"])
