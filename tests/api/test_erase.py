"""DELETE /swarms/{id} (SPEC §16), on SQLite and on PostgreSQL: the content goes for good (a
raw read of every table finds none of it), the money stays (usage, ledger, daily caps), the
swarm reads `erased`, its webhook is not sent again, a retry of it is refused and a retry made
before it keeps its copy."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from app.db.tables import DailySpend, GatewayCall, Webhook
from app.db.tenant_tables import TenantDailySpend
from tests.conftest import ENV_SEALER, Harness, make_settings, start_harness
from tests.erase_support import content_swarm, raw_dump, tooled_harness
from tests.helpers import agent, by_name, error_of, read_events, until

FLAKY_400 = "[[sim when=flaky fail=400]]"


def erased_count(reason: str) -> float:
    return REGISTRY.get_sample_value("swarm_erased_swarms_total", {"reason": reason}) or 0.0


async def money(h: Harness, swarm_id: str) -> dict[str, Any]:
    """What erasing must not change: the ledger rows, the daily spend rows, /usage."""
    async with h.app.state.sessions() as s:
        ledger = [(r.id, r.model, r.outcome, r.cost_usd, r.prompt_tokens, r.completion_tokens,
                   r.created_at) for r in (await s.execute(
                       select(GatewayCall).where(GatewayCall.swarm_id == swarm_id)
                       .order_by(GatewayCall.id))).scalars()]
        daily = [(r.day, r.spent_usd) for r in (await s.execute(select(DailySpend))).scalars()]
        tenant = [(r.tenant, r.day, r.spent_usd)
                  for r in (await s.execute(select(TenantDailySpend))).scalars()]
    usage = {g: (await h.client.get("/usage", params={"group_by": g})).json()
             for g in ("model", "day", "tenant")}
    return {"ledger": ledger, "daily": daily, "tenant_daily": tenant, "usage": usage}


@pytest.fixture
async def tooled(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    h, close = await tooled_harness(database_url, tmp_path, daily_budget_usd="100")
    yield h
    await close()


async def test_erase_removes_every_content_and_keeps_the_money(tooled: Harness) -> None:
    h = tooled
    tag = f"zq{uuid.uuid4().hex[:12]}"
    done = await h.run(content_swarm(tag), timeout=120)
    assert done["status"] == "succeeded", done["error"]
    assert by_name(done)["reader"]["tool_calls"] == 1
    assert by_name(done)["shaped"]["output_json"] == {"k": f"{tag}-json"}
    detail = (await h.client.get(f"/swarms/{done['id']}/subtasks/reader")).json()
    assert any(tag in json.dumps(m) for m in detail["transcript"] if m["role"] == "tool")
    if ENV_SEALER is None:  # the content is there, in several tables (else encrypted)
        assert tag in await raw_dump(h)
    before = await money(h, done["id"])
    assert before["ledger"] and before["daily"] and before["tenant_daily"]
    counted = erased_count("request")

    r = await h.client.delete(f"/swarms/{done['id']}")
    assert r.status_code == 204 and r.content == b""
    assert erased_count("request") == counted + 1

    assert tag not in await raw_dump(h)  # no table holds any of it
    assert await money(h, done["id"]) == before  # usage, ledger and caps unchanged
    got = (await h.client.get(f"/swarms/{done['id']}")).json()
    assert got["erased"] is True and got["status"] == "succeeded"
    assert (got["task"], got["metadata"], got["result"]) == ("", {}, None)
    assert got["usage"] == done["usage"] and got["created_at"] == done["created_at"]
    assert got["finished_at"] == done["finished_at"]
    assert all(s["output"] is None and s["output_json"] is None for s in got["subtasks"])
    assert [s["status"] for s in got["subtasks"]] == [s["status"] for s in done["subtasks"]]
    listed = (await h.client.get("/swarms")).json()["items"]
    assert [(i["id"], i["erased"]) for i in listed] == [(done["id"], True)]
    events = await read_events(h.client, done["id"])
    assert events[-1]["event"] == "swarm.completed"  # the stream still ends
    assert all(e["data"] == {"seq": int(e["id"]), "swarm_id": done["id"], "erased": True}
               for e in events)
    detail = (await h.client.get(f"/swarms/{done['id']}/subtasks/reader")).json()
    assert detail["transcript"] == [] and detail["output"] is None
    # a second erase is a no-op answered alike
    assert (await h.client.delete(f"/swarms/{done['id']}")).status_code == 204
    assert erased_count("request") == counted + 1


async def test_only_an_ended_swarm_of_the_tenant_is_erased(harness: Harness) -> None:
    h = harness
    r = await h.post({"task": "t", "agents": [agent("slow", "[[sim latency_ms=30000]]")]})
    swarm_id = r.json()["id"]
    err = error_of(await h.client.delete(f"/swarms/{swarm_id}"), 409, "not_terminal")
    assert err["details"]["status"] in ("queued", "planning", "running")
    assert (await h.client.get(f"/swarms/{swarm_id}")).json()["erased"] is False
    error_of(await h.client.delete(f"/swarms/{uuid.uuid4()}"), 404, "not_found")
    error_of(await h.client.delete("/swarms/not-a-uuid"), 404, "not_found")
    assert (await h.client.post(f"/swarms/{swarm_id}/cancel")).status_code == 202
    await h.wait(swarm_id)
    assert (await h.client.delete(f"/swarms/{swarm_id}")).status_code == 204


async def test_another_tenants_swarm_is_not_found(database_url: str) -> None:
    h, close = await start_harness(make_settings(database_url, api_keys="t1:k1,t2:k2"))
    try:
        one = {"Authorization": "Bearer k1"}
        r = await h.client.post("/swarms", json={"task": "t", "agents": [{"name": "a"}]},
                                headers=one)
        swarm_id = r.json()["id"]
        await until(lambda: _ended(h, swarm_id, one), 30, "the swarm's end")
        error_of(await h.client.delete(f"/swarms/{swarm_id}",
                                       headers={"Authorization": "Bearer k2"}), 404, "not_found")
        error_of(await h.client.delete(f"/swarms/{swarm_id}"), 401)
        got = (await h.client.get(f"/swarms/{swarm_id}", headers=one)).json()
        assert got["erased"] is False and got["task"] == "t"
    finally:
        await close()


async def _ended(h: Harness, swarm_id: str, headers: dict[str, str]) -> bool:
    r = await h.client.get(f"/swarms/{swarm_id}", headers=headers)
    return bool(r.json()["status"] in ("succeeded", "failed", "cancelled"))


async def test_a_retry_of_an_erased_swarm_is_refused_and_an_earlier_retry_keeps_its_copy(
        harness: Harness) -> None:
    h = harness
    flags = h.simulator.state.config.flags
    flags.add("flaky")
    tag = f"zq{uuid.uuid4().hex[:12]}"
    old = await h.run({"task": f"{tag} task", "metadata": {"k": tag},
                       "agents": [agent("a", prompt=f"{tag} a"),
                                  agent("x", FLAKY_400, depends_on=["a"])]})
    assert old["status"] == "failed" and by_name(old)["a"]["status"] == "succeeded"
    flags.discard("flaky")
    r = await h.client.post(f"/swarms/{old['id']}/retry")
    assert r.status_code == 202, r.text
    new = await h.wait(r.json()["id"])
    reused = by_name(new)["a"]
    assert reused["reused"] is True and reused["output"] == by_name(old)["a"]["output"]

    assert (await h.client.delete(f"/swarms/{old['id']}")).status_code == 204
    again = (await h.client.get(f"/swarms/{new['id']}")).json()  # another swarm: untouched
    assert again["erased"] is False and again["task"] == f"{tag} task"
    assert again["metadata"] == {"k": tag}
    assert by_name(again)["a"]["output"] == reused["output"]
    assert again["retry_of"] == old["id"]
    erased = (await h.client.get(f"/swarms/{old['id']}")).json()
    assert erased["retried_by"] == new["id"] and erased["erased"] is True
    err = error_of(await h.client.post(f"/swarms/{old['id']}/retry"), 409, "swarm_erased")
    assert err["details"]["status"] == old["status"]


class Receiver:
    """A webhook receiver that answers 500 (a retry follows) until told otherwise."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.status = 500

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.status)


async def test_erase_during_a_webhook_retry_drops_the_delivery(database_url: str) -> None:
    receiver = Receiver()
    settings = make_settings(database_url, webhook_secret="s", webhook_allow_http=True,
                             webhook_allow_private=True, webhook_retry_base_s=0.3)
    h, close = await start_harness(settings,
                                   webhook_transport=httpx.MockTransport(receiver.handler))
    try:
        tag = f"zq{uuid.uuid4().hex[:12]}"
        done = await h.run({"task": f"{tag} task", "agents": [{"name": "a"}],
                            "webhook_url": "http://hooks.example/x"})
        await until(lambda: len(receiver.requests) >= 2, 20, "two delivery attempts")
        assert (await h.client.delete(f"/swarms/{done['id']}")).status_code == 204
        sent = len(receiver.requests)
        receiver.status = 200
        async with h.app.state.sessions() as s:
            assert (await s.execute(select(Webhook))).scalars().all() == []
        # the dispatcher goes on: another swarm's delivery is sent, the erased one's never
        # again (at most the one in flight at the erase), and none carries the content
        other = await h.run({"task": "t", "agents": [{"name": "a"}],
                             "webhook_url": "http://hooks.example/y"})
        await until(lambda: any(_delivery(r) == other["id"] for r in receiver.requests), 20,
                    "the other swarm's delivery")
        late = [r for r in receiver.requests[sent:] if _delivery(r) == done["id"]]
        assert len(late) <= 1
        assert all(tag not in r.content.decode() for r in late)
    finally:
        await close()


def _delivery(request: httpx.Request) -> str:
    return request.headers["X-Swarm-Delivery"].partition(":")[0]


async def test_the_async_client_erases(api: Harness) -> None:
    from swarm_api_client import AsyncSwarmClient, Conflict

    done = await api.run({"task": "t", "agents": [{"name": "a"}]})
    async with AsyncSwarmClient("http://api", transport=httpx.ASGITransport(
            app=api.app)) as client:
        assert await client.erase(done["id"]) is None
        swarm = await client.get(done["id"])
        assert swarm.erased is True and swarm.task == "" and swarm.result is None
        await client.erase(done["id"])  # again: no error
        running = await client.create({"task": "t",
                                       "agents": [agent("a", "[[sim latency_ms=30000]]")]})
        with pytest.raises(Conflict) as refused:
            await client.erase(running.id)
        assert refused.value.code == "not_terminal"
        await client.cancel(running.id)


async def test_erase_needs_the_write_scope_and_is_audited(database_url: str,
                                                          tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.acme]\nkeys = [{ key = "reader", scopes = ["swarms:read"] },'
                       ' { key = "writer", id = "ops" }]\n')
    h, close = await start_harness(make_settings(database_url, tenants_file=str(tenants)))
    try:
        writer = {"Authorization": "Bearer writer"}
        r = await h.client.post("/swarms", json={"task": "t", "agents": [{"name": "a"}]},
                                headers=writer)
        swarm_id = r.json()["id"]
        await until(lambda: _ended(h, swarm_id, writer), 30, "the swarm's end")
        error_of(await h.client.delete(f"/swarms/{swarm_id}",
                                       headers={"Authorization": "Bearer reader"}),
                 403, "insufficient_scope")
        assert (await h.client.delete(f"/swarms/{swarm_id}", headers=writer)).status_code == 204
        assert (await h.client.delete(f"/swarms/{swarm_id}", headers=writer)).status_code == 204
        rows = (await h.client.get("/audit", params={"action": "erase"},
                                   headers=writer)).json()["items"]
        assert [(r["action"], r["swarm_id"], r["key_id"]) for r in rows] == [
            ("erase", swarm_id, "ops")]  # one change: the second erase changed nothing
    finally:
        await close()
