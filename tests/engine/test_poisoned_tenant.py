"""A gateway that answers one tenant with text no database stores (NUL, lone surrogates in
contents and error bodies) must not touch another tenant's swarm, and every answer it gave is
in the ledger (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from app.gateway import attempts as gateway_attempts
from app.pricing import PriceTable
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent

KEYS = {"alpha": "key-alpha", "beta": "key-beta"}
POISON = "[[sim poison=1]]"


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


@pytest.fixture
async def two_tenants(database_url: str) -> AsyncIterator[Harness]:
    keys = ",".join(f"{t}:{k}" for t, k in KEYS.items())
    h, close = await start_harness(make_settings(database_url, api_keys=keys))
    yield h
    await close()


def answered_usd(h: Harness) -> Decimal:
    """What the simulator answered with complete 200s: what a gateway bills."""
    prices = PriceTable.builtin()
    return sum((prices[model].cost(p, c, cached)
                for per_model in h.sim_stats.answered.values()
                for model, (p, c, cached, _n) in per_model.items()), Decimal(0))


async def start(h: Harness, tenant: str, body: dict[str, Any]) -> str:
    r = await h.post(body, headers=auth(tenant))
    assert r.status_code == 202, r.text
    swarm_id: str = r.json()["id"]
    return swarm_id


async def finish(h: Harness, tenant: str, swarm_id: str) -> dict[str, Any]:
    while True:
        r = await h.client.get(f"/swarms/{swarm_id}", params={"wait": 10},
                               headers=auth(tenant))
        data: dict[str, Any] = r.json()
        if data["status"] in ("succeeded", "failed", "cancelled"):
            return data


CLEAN = {"task": "the clean tenant's work", "max_tokens": 200,
         "agents": [agent(f"c{i}") for i in range(40)], "limits": {"concurrency": 40}}
POISONED = {"task": f"the poisoned tenant's work {POISON}", "max_tokens": 200,
            "agents": [agent("p1", POISON), agent("p2", POISON),
                       agent("retried", f"{POISON} [[sim fail=500 times=1 retry_after=0]]"),
                       agent("refused", f"{POISON} [[sim fail=400]]")],
            "limits": {"concurrency": 4, "failure_tolerance": 0.5}}
PLANNED = {"task": f"a planned task {POISON}", "max_tokens": 200}


async def test_a_poisoned_tenant_gets_clean_outputs_and_the_other_is_untouched(
        two_tenants: Harness) -> None:
    h = two_tenants
    clean_id = await start(h, "alpha", CLEAN)
    poisoned_id = await start(h, "beta", POISONED)
    planned_id = await start(h, "beta", PLANNED)
    clean = await finish(h, "alpha", clean_id)
    poisoned = await finish(h, "beta", poisoned_id)
    planned = await finish(h, "beta", planned_id)

    assert clean["status"] == "succeeded", clean["error"]
    assert all(s["status"] == "succeeded" and s["attempts"] == 1 and not s["sanitized"]
               for s in clean["subtasks"])
    assert "\ufffd" not in clean["result"]

    assert poisoned["status"] == "succeeded", poisoned["error"]
    subs = {s["name"]: s for s in poisoned["subtasks"]}
    for name in ("p1", "p2", "retried", "@synthesizer"):
        assert subs[name]["status"] == "succeeded", subs[name]
        assert subs[name]["sanitized"] and "\ufffd nul \ufffd lone surrogate" in \
            subs[name]["output"], name
    assert subs["retried"]["attempts"] == 2
    refused = subs["refused"]  # its error body was poisoned too: stored clean
    assert refused["status"] == "failed" and refused["error"]["code"] == "gateway_rejected"
    assert "\ufffd nul \ufffd lone surrogate" in refused["error"]["message"]
    events = (await h.client.get(f"/swarms/{poisoned_id}/events",
                                 headers=auth("beta"))).text
    assert '"sanitized":true' in events.replace(" ", "")

    assert planned["status"] == "succeeded", planned["error"]
    assert all("\ufffd" in s["output"] for s in planned["subtasks"] if s["kind"] == "worker")

    # every answer the gateway gave is in some swarm's usage, to the last digit
    total = sum(Decimal(d["usage"]["cost_usd"]) for d in (clean, poisoned, planned))
    assert total == answered_usd(h) > 0
    assert all(d["usage"]["unresolved_usd"] == "0" for d in (clean, poisoned, planned))


async def test_unstorable_rows_fail_only_their_own_subtask_and_keep_their_spend(
        two_tenants: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cleaning is switched off: the poisoned swarm's results cannot be written, so the
    group commit retries per swarm; only the poisoned subtasks fail (clear error), the other
    tenant's swarm, written in the same batches, succeeds, and no spend is lost."""
    monkeypatch.setattr(gateway_attempts, "storable", lambda text: (text, False))
    h = two_tenants
    clean_id = await start(h, "alpha", CLEAN)
    poisoned_id = await start(h, "beta", {**POISONED, "agents": POISONED["agents"][:2]})
    clean = await finish(h, "alpha", clean_id)
    poisoned = await finish(h, "beta", poisoned_id)

    assert clean["status"] == "succeeded", clean["error"]
    assert all(s["status"] == "succeeded" for s in clean["subtasks"])
    assert poisoned["status"] == "failed"
    assert poisoned["error"]["code"] == "failure_tolerance_exceeded"
    for s in poisoned["subtasks"]:
        if s["kind"] == "worker":
            assert s["status"] == "failed" and s["output"] is None
            assert s["error"]["code"] == "output_unstorable", s["error"]
            assert Decimal(s["usage"]["cost_usd"]) > 0  # billed, though its result is lost
    total = sum(Decimal(d["usage"]["cost_usd"]) for d in (clean, poisoned))
    assert total == answered_usd(h)
    # a refused success's event number goes to the failure: the events stay consecutive
    stream = (await h.client.get(f"/swarms/{poisoned_id}/events", headers=auth("beta"))).text
    ids = [int(line[4:]) for line in stream.splitlines() if line.startswith("id: ")]
    assert ids == list(range(1, len(ids) + 1)) and len(ids) > 4, ids
    report = (await h.client.get("/usage", headers=auth("beta"))).json()["total"]
    assert Decimal(report["cost_usd"]) == Decimal(poisoned["usage"]["cost_usd"])
