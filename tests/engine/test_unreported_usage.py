"""An answer used without a usable usage is billed its request's bounds — an upper bound, not
what the gateway billed — so it is counted in `unresolved_usd` (the swarm's, the tenant's
`/usage`, the metric) as an attempt whose outcome was lost is; an answer that reported its
usage is settled. SQLite and PostgreSQL."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from app.db.session import make_db_engine, make_session_factory
from app.db.tables import GatewayCall
from app.gateway.client import GatewayClient
from tests.conftest import app_on, make_settings
from tests.helpers import agent, by_name

MODEL = "kimi-k2.5"


def _answering(request: httpx.Request) -> httpx.Response:
    """Usage for every call but the ones whose prompt names `silent`."""
    body = json.loads(request.content)
    answer: dict[str, Any] = {"choices": [{"message": {"role": "assistant", "content": "done"},
                                           "finish_reason": "stop"}]}
    if "silent" not in json.dumps(body["messages"]):
        answer["usage"] = {"prompt_tokens": 20, "completion_tokens": 5}
    return httpx.Response(200, json=answer)


def unresolved_metric() -> float:
    return REGISTRY.get_sample_value("swarm_spend_unresolved_usd_total", {"model": MODEL}) or 0.0


async def test_an_answer_without_usage_is_unresolved_spend(database_url: str) -> None:
    before = unresolved_metric()
    gateway = GatewayClient("http://gw/v1", transport=httpx.MockTransport(_answering))
    async with app_on(make_settings(database_url), gateway) as c:
        r = await c.post("/swarms", json={
            "task": "t", "model": MODEL, "max_tokens": 40,
            "synthesis": {"strategy": "concatenate"},
            "agents": [agent("silent"), agent("reported")]})
        assert r.status_code == 202, r.text
        data: dict[str, Any] = (await c.get(f"/swarms/{r.json()['id']}",
                                            params={"wait": 20})).json()
        report = (await c.get("/usage")).json()
    assert data["status"] == "succeeded", data["error"]
    subs = by_name(data)
    silent, reported = (Decimal(subs[n]["usage"]["cost_usd"]) for n in ("silent", "reported"))
    assert subs["silent"]["usage"]["completion_tokens"] == 40  # billed its max_tokens
    assert subs["reported"]["usage"]["completion_tokens"] == 5
    assert silent > reported > 0
    assert Decimal(data["usage"]["unresolved_usd"]) == silent
    assert Decimal(data["usage"]["cost_usd"]) == silent + reported
    total = report["total"]
    assert Decimal(total["unresolved_usd"]) == silent
    assert Decimal(total["settled_usd"]) == reported
    assert unresolved_metric() - before == pytest.approx(float(silent), abs=1e-12)

    engine = make_db_engine(database_url)
    try:
        async with make_session_factory(engine)() as s:
            ledger = (await s.execute(select(GatewayCall.subtask_name, GatewayCall.at_bound)
                                      .where(GatewayCall.swarm_id == data["id"]))).all()
    finally:
        await engine.dispose()
    assert sorted(ledger) == [("reported", False), ("silent", True)]
