"""The audit trail (SPEC §16): a row per change a caller makes — create, cancel, retry, a facade
swarm (`chat`), a passthrough call — naming the key by its id, written with the change (a
creation refused writes none); `GET /audit` pages it newest first by cursor, filters by time
and action, and shows a tenant only its own rows."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm_api_client import AsyncSwarmClient
from swarm_api_client.errors import SwarmApiError
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent, error_of

A = {"Authorization": "Bearer ka-secret"}
B = {"Authorization": "Bearer kb-secret"}
SLOW = {"task": "t", "agents": [agent("a", "[[sim latency_ms=20000]]")]}
QUICK = {"task": "t", "agents": [agent("a")]}
CHAT = {"model": "kimi-k2.5", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def two(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    tenants = tmp_path / "tenants.toml"
    digest = hashlib.sha256(b"ka-secret").hexdigest()
    tenants.write_text(f'[tenants.a]\nkeys = [{{ sha256 = "{digest}", id = "ci" }}]\n'
                       "[tenants.full]\nmax_active_swarms = 0\n")
    h, close = await start_harness(make_settings(
        database_url, tenants_file=str(tenants), api_keys="b:kb-secret,full:kf-secret"))
    yield h
    await close()


async def audit_of(h: Harness, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    """Every row, page by page (the cursor followed to its end)."""
    items: list[dict[str, Any]] = []
    while True:
        r = await h.client.get("/audit", params=params, headers=headers)
        assert r.status_code == 200, r.text
        page = r.json()
        items += page["items"]
        if page["next_cursor"] is None:
            return items
        params = {**params, "cursor": page["next_cursor"]}


async def test_each_change_is_one_row_naming_the_key(two: Harness) -> None:
    h = two
    r = await h.post(SLOW, headers={**A, "X-Request-Id": "req-create-1"})
    assert r.status_code == 202, r.text
    sid = r.json()["id"]
    assert (await h.client.post(f"/swarms/{sid}/cancel", headers=A)).status_code == 202
    while (await h.client.get(f"/swarms/{sid}", params={"wait": 5}, headers=A)).json()[
            "status"] != "cancelled":
        pass
    retried = await h.client.post(f"/swarms/{sid}/retry", json={"limits": {}}, headers=A)
    assert retried.status_code == 202, retried.text
    chat = await h.client.post("/v1/chat/completions", headers=A, json={
        **CHAT, "agent_swarm": {"enabled": True, "max_sub_agents": 2}})
    assert chat.status_code == 200, chat.text
    plain = await h.client.post("/v1/chat/completions", json=CHAT, headers=A)
    assert plain.status_code == 200, plain.text
    rows = await audit_of(h, A)
    assert [r["action"] for r in rows] == ["passthrough", "chat", "retry", "cancel", "create"]
    assert {r["tenant"] for r in rows} == {"a"} and {r["key_id"] for r in rows} == {"ci"}
    assert {r["client"] for r in rows} == {"127.0.0.1"}
    assert [r["swarm_id"] for r in rows] == [None, chat.json()["swarm_id"],
                                             retried.json()["id"], sid, sid]
    assert rows[-1]["request_id"] == "req-create-1"
    assert all(r["request_id"] for r in rows)  # one made up where the caller sent none
    times = [r["time"] for r in rows]
    assert times == sorted(times, reverse=True)
    assert "ka-secret" not in repr(rows)
    await h.client.post(f"/swarms/{retried.json()['id']}/cancel", headers=A)


async def test_pages_filters_and_bad_parameters(two: Harness) -> None:
    h = two
    ids = [(await h.post(QUICK, headers=A)).json()["id"] for _ in range(5)]
    r = await h.client.get("/audit", params={"limit": 2}, headers=A)
    first = r.json()
    assert [i["swarm_id"] for i in first["items"]] == ids[::-1][:2]
    assert first["next_cursor"] is not None
    everything = await audit_of(h, A, limit=2)
    assert [i["swarm_id"] for i in everything] == ids[::-1]  # each once, newest first
    assert await audit_of(h, A, action="cancel") == []
    assert len(await audit_of(h, A, action="create")) == 5
    middle = everything[2]["time"]
    newer = await audit_of(h, A, **{"from": middle})
    assert [i["swarm_id"] for i in newer] == ids[::-1][:3]
    older = await audit_of(h, A, to=middle)
    assert [i["swarm_id"] for i in older] == ids[::-1][3:]
    for params, field in (({"cursor": "nonsense!"}, "cursor"), ({"limit": 0}, "limit"),
                          ({"limit": 501}, "limit"), ({"action": "delete"}, "action"),
                          ({"from": "yesterday"}, "from"),
                          ({"from": "2026-12-02", "to": "2026-12-01"}, "to")):
        err = error_of(await h.client.get("/audit", params=params, headers=A), 422)
        assert field in repr(err["details"]), (params, err)


async def test_a_tenant_sees_only_its_own_rows(two: Harness) -> None:
    h = two
    mine = (await h.post(QUICK, headers=A)).json()["id"]
    theirs = (await h.post(QUICK, headers=B)).json()["id"]
    assert [r["swarm_id"] for r in await audit_of(h, A)] == [mine]
    rows = await audit_of(h, B)
    assert [r["swarm_id"] for r in rows] == [theirs]
    assert rows[0]["tenant"] == "b" and rows[0]["key_id"] == \
        hashlib.sha256(b"kb-secret").hexdigest()[:8]  # no id given: the digest's first 8
    # another tenant's cursor finds nothing of the first tenant's
    page = (await h.client.get("/audit", params={"limit": 1}, headers=A)).json()
    assert page["next_cursor"] is None


async def test_a_refused_creation_writes_no_row(two: Harness) -> None:
    h = two
    full = {"Authorization": "Bearer kf-secret"}
    error_of(await h.post(QUICK, headers=full), 429, "quota_exceeded")
    idem = {**full, "Idempotency-Key": "k-1"}
    error_of(await h.post(QUICK, headers=idem), 429, "quota_exceeded")
    error_of(await h.post({"task": "t", "agents": [agent("a", model="nope")]}, headers=A), 422)
    error_of(await h.client.post(f"/swarms/{'0' * 8}-0000-0000-0000-{'0' * 12}/cancel",
                                 headers=A), 404)
    assert await audit_of(h, {"Authorization": "Bearer kf-secret"}) == []
    assert await audit_of(h, A) == []


async def test_open_mode_records_the_default_tenant(harness: Harness) -> None:
    sid = (await harness.post(QUICK)).json()["id"]
    rows = (await harness.client.get("/audit")).json()["items"]
    assert [(r["tenant"], r["key_id"], r["action"], r["swarm_id"]) for r in rows] == [
        ("default", None, "create", sid)]


async def test_the_client_reads_the_trail(two: Harness) -> None:
    h = two
    sid = (await h.post(QUICK, headers=A)).json()["id"]
    transport = httpx.ASGITransport(app=h.app)
    async with AsyncSwarmClient("http://api", api_key="ka-secret", transport=transport) as c:
        page = await c.audit(action="create", limit=5)
        assert [(e.action, e.swarm_id, e.key_id) for e in page.items] == [("create", sid, "ci")]
        assert page.next_cursor is None
        assert (await c.audit(action="cancel")).items == []
        with pytest.raises(SwarmApiError) as refused:
            await c.audit(cursor="nonsense!")
        assert refused.value.status_code == 422 and refused.value.code == "invalid_cursor"
