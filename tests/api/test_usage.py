"""GET /usage: ledger sums, grouping, tenant scope, time windows, errors (SPEC §3)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import Harness, make_settings, start_harness

FAILING = "[[sim fail=500 times=1 retry_after=0]]"


def swarm_body(model: str, directives: str = "") -> dict[str, Any]:
    return {"task": "t", "model": model, "agents": [
        {"name": "a", "system_prompt": f"You are a. {directives}"},
        {"name": "b", "system_prompt": "You are b.", "model": "deepseek-v3.2"}]}


async def run_some(h: Harness) -> list[dict[str, Any]]:
    runs = [await h.run(swarm_body("kimi-k2.5")), await h.run(swarm_body("gpt-4.1", FAILING)),
            await h.run(swarm_body("kimi-k2.5"))]
    assert all(r["status"] == "succeeded" for r in runs)
    return runs


async def run_as(h: Harness, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    r = await h.client.post("/swarms", json=body, headers=headers)
    assert r.status_code == 202, r.text
    while True:
        data: dict[str, Any] = (await h.client.get(
            f"/swarms/{r.json()['id']}", params={"wait": 10}, headers=headers)).json()
        if data["status"] in ("succeeded", "failed", "cancelled"):
            return data


def swarm_totals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in runs),
            "completion_tokens": sum(r["usage"]["completion_tokens"] for r in runs),
            "cost_usd": sum((Decimal(r["usage"]["cost_usd"]) for r in runs), Decimal(0)),
            "gateway_calls": sum(r["usage"]["gateway_calls"] for r in runs)}


async def test_usage_by_model_reconciles_exactly_with_the_swarms(harness: Harness) -> None:
    runs = await run_some(harness)
    r = await harness.client.get("/usage", params={"group_by": "model"})
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["group_by"] == "model" and data["from"] is None and data["to"] is None
    assert [i["key"] for i in data["items"]] == ["deepseek-v3.2", "gpt-4.1", "kimi-k2.5"]
    total = data["total"]
    expected = swarm_totals(runs)
    assert Decimal(total["cost_usd"]) == expected["cost_usd"]  # exact, not to the cent only
    assert total["prompt_tokens"] == expected["prompt_tokens"]
    assert total["completion_tokens"] == expected["completion_tokens"]
    # the failed attempt of gpt-4.1 is a ledger row too: 2 agents + synthesis, + 1 retry
    assert total["gateway_calls"] == expected["gateway_calls"] == 10
    assert sum(i["gateway_calls"] for i in data["items"]) == total["gateway_calls"]
    assert sum(Decimal(i["cost_usd"]) for i in data["items"]) == Decimal(total["cost_usd"])
    by_key = {i["key"]: i for i in data["items"]}
    assert by_key["gpt-4.1"]["gateway_calls"] == 3  # a (failed once, then ok) + synthesizer
    # money is an exact decimal string, never a float rendering
    assert all("e" not in i["cost_usd"].lower() for i in data["items"])


async def test_usage_by_day_and_tenant(harness: Harness) -> None:
    runs = await run_some(harness)
    today = datetime.now(UTC).date().isoformat()
    by_day = (await harness.client.get("/usage", params={"group_by": "day"})).json()
    by_tenant = (await harness.client.get("/usage", params={"group_by": "tenant"})).json()
    assert [i["key"] for i in by_day["items"]] == [today]
    assert [i["key"] for i in by_tenant["items"]] == ["default"]
    cost = swarm_totals(runs)["cost_usd"]
    assert Decimal(by_day["total"]["cost_usd"]) == Decimal(by_tenant["total"]["cost_usd"]) == cost


async def test_time_window_is_inclusive_from_exclusive_to(harness: Harness) -> None:
    await run_some(harness)
    now = datetime.now(UTC)
    tomorrow = (now + timedelta(days=1)).date().isoformat()
    today = now.date().isoformat()
    c = harness.client

    async def calls(**params: str) -> int:
        r = await c.get("/usage", params=params)
        assert r.status_code == 200, r.text
        n: int = r.json()["total"]["gateway_calls"]
        return n

    assert await calls(**{"from": today}) == 10
    assert await calls(**{"from": today, "to": tomorrow}) == 10
    assert await calls(to=today) == 0
    assert await calls(**{"from": tomorrow}) == 0
    past = (now - timedelta(hours=1)).isoformat()
    assert await calls(**{"from": past}) == 10
    assert await calls(**{"from": past.replace("+00:00", "Z")}) == 10
    naive = (now - timedelta(hours=1)).replace(tzinfo=None).isoformat()
    assert await calls(**{"from": naive}) == 10  # naive means UTC
    # an offset: 1 hour ago in UTC+02:00, as an unencoded "+" would arrive (a space)
    local = (now - timedelta(hours=1)).astimezone(timezone(timedelta(hours=2))).isoformat(
        timespec="seconds")
    assert await calls(**{"from": local}) == 10
    assert await calls(**{"from": local.replace("+", " ")}) == 10
    empty = (await c.get("/usage", params={"from": tomorrow})).json()
    assert empty["items"] == [] and empty["total"]["cost_usd"] == "0"
    assert empty["from"].startswith(tomorrow)


@pytest.mark.parametrize(("params", "field"), [
    ({"group_by": "swarm"}, "group_by"),
    ({"from": "yesterday"}, "from"),
    ({"to": "2026-13-01"}, "to"),
    ({"from": "2026-11-30", "to": "2026-11-29"}, "to"),
])
async def test_bad_parameters_are_422_naming_the_field(api: Harness, params: dict[str, str],
                                                      field: str) -> None:
    r = await api.client.get("/usage", params=params)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "validation_error"
    assert [d["field"] for d in err["details"]] == [field]
    assert field in err["message"]


@pytest.fixture
async def tenants(sqlite_url: str) -> AsyncIterator[Harness]:
    h, close = await start_harness(make_settings(sqlite_url, api_keys="acme:ka,globex:kb"))
    yield h
    await close()


async def test_usage_is_tenant_scoped(tenants: Harness) -> None:
    h = tenants
    acme, globex = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    a = [await run_as(h, swarm_body("kimi-k2.5"), acme) for _ in range(2)]
    b = [await run_as(h, swarm_body("gpt-4.1"), globex)]
    for headers, runs, name in ((acme, a, "acme"), (globex, b, "globex")):
        data = (await h.client.get("/usage", params={"group_by": "tenant"},
                                   headers=headers)).json()
        assert [i["key"] for i in data["items"]] == [name]
        assert Decimal(data["total"]["cost_usd"]) == swarm_totals(runs)["cost_usd"]
    models = (await h.client.get("/usage", headers=globex)).json()
    assert [i["key"] for i in models["items"]] == ["deepseek-v3.2", "gpt-4.1"]
    r = await h.client.get("/usage")
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "unauthorized"


async def test_usage_is_documented(api: Harness) -> None:
    doc = (await api.client.get("/openapi.json")).json()
    op = doc["paths"]["/usage"]["get"]
    assert {"200", "401", "422"} <= set(op["responses"])
    assert {p["name"] for p in op["parameters"]} == {"from", "to", "group_by"}
    schema = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    report = doc["components"]["schemas"][schema.rsplit("/", 1)[1]]
    assert {"from", "to", "group_by", "items", "total"} <= set(report["properties"])
    assert op["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ErrorResponse")
