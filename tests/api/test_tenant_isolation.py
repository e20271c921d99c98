"""Tenant isolation on every route (SPEC §3, §8): another tenant's swarm is a missing one
(404, the same answer, nothing changed) on every route that names it; lists, cursors,
`queue_position`, Idempotency-Keys, the facade's swarms and passthrough rows and `/usage`
stay in their tenant; every route answers 401 to a caller without a valid key, whatever its
body. (Found two defects when written: the global daily cap's refusals told one tenant what
the others spent — tests/engine/test_daily_cap.py — and retry and /v1 read a body before the
key.)"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent, error_of

A = {"Authorization": "Bearer ka"}
B = {"Authorization": "Bearer kb"}
MISSING = "00000000-0000-0000-0000-000000000000"


@pytest.fixture
async def two(database_url: str) -> AsyncIterator[Harness]:
    h, close = await start_harness(make_settings(database_url, api_keys="a:ka,b:kb"))
    yield h
    await close()


@pytest.fixture
async def idle(database_url: str) -> AsyncIterator[Harness]:
    h, close = await start_harness(make_settings(database_url, api_keys="a:ka,b:kb"),
                                   run_engine=False)
    yield h
    await close()


async def done(h: Harness, sid: str, headers: dict[str, str]) -> dict[str, Any]:
    while True:
        r = await h.client.get(f"/swarms/{sid}", params={"wait": 10}, headers=headers)
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        if data["status"] in ("succeeded", "failed", "cancelled"):
            return data


def strip(err: dict[str, Any], sid: str) -> Any:
    return (err["code"], err["message"].replace(sid, "X"),
            repr(err["details"]).replace(sid, "X"))


async def test_b_on_a_terminal_swarms_is_404_like_a_missing_one(two: Harness) -> None:
    h = two
    ok = (await h.post({"task": "t", "agents": [agent("a")]}, headers=A)).json()["id"]
    bad = (await h.post({"task": "t", "agents": [agent("a", "[[sim fail=400]]")]},
                        headers=A)).json()["id"]
    assert (await done(h, ok, A))["status"] == "succeeded"
    assert (await done(h, bad, A))["status"] == "failed"
    for sid in (ok, bad):
        for method, tail, kw in (("GET", "", {}), ("GET", "", {"params": {"wait": 1}}),
                                 ("GET", "/events", {}),
                                 ("GET", "/events", {"headers": {"Last-Event-ID": "1"}}),
                                 ("POST", "/cancel", {}), ("POST", "/retry", {}),
                                 ("POST", "/retry", {"json": {"limits": {"concurrency": 2}}}),
                                 ("POST", "/retry", {"headers": {"Idempotency-Key": "k"}}),
                                 ("GET", "/subtasks/a", {}), ("GET", "/subtasks/@synthesizer", {})):
            headers = {**B, **kw.pop("headers", {})}
            theirs = await h.client.request(method, f"/swarms/{sid}{tail}", headers=headers, **kw)
            none = await h.client.request(method, f"/swarms/{MISSING}{tail}", headers=headers,
                                          **kw)
            e1 = error_of(theirs, 404, "not_found")
            e2 = error_of(none, 404, "not_found")
            assert strip(e1, sid) == strip(e2, MISSING), (method, tail)
    # nothing changed for A
    assert (await h.client.get("/swarms", params={"retry_of": bad}, headers=A)).json()[
        "items"] == []
    assert (await h.client.get("/swarms", headers=B)).json()["items"] == []
    for params in ({"retry_of": bad}, {"status": "failed"}, {"status": "succeeded"}):
        assert (await h.client.get("/swarms", params=params, headers=B)).json()["items"] == []
    usage = (await h.client.get("/usage", params={"group_by": "tenant"}, headers=B)).json()
    assert usage["items"] == [] and Decimal(usage["total"]["cost_usd"]) == 0


async def test_a_cursor_made_of_a_swarm_pages_only_bs(two: Harness) -> None:
    h = two
    a_ids = [(await h.post({"task": f"a{i}", "agents": [agent("a")]}, headers=A)).json()
             for i in range(3)]
    b_ids = [(await h.post({"task": f"b{i}", "agents": [agent("a")]}, headers=B)).json()["id"]
             for i in range(2)]
    newest = a_ids[-1]
    raw = f"{newest['created_at'].replace('Z', '+00:00')}|{newest['id']}"
    cursor = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    r = await h.client.get("/swarms", params={"cursor": cursor, "limit": 50}, headers=B)
    assert r.status_code == 200, r.text
    assert {s["id"] for s in r.json()["items"]} <= set(b_ids)


async def test_queue_position_counts_only_the_callers_queue(idle: Harness) -> None:
    h = idle
    for i in range(4):
        assert (await h.post({"task": f"a{i}", "agents": [agent("a")]}, headers=A)
                ).status_code == 202
    created = (await h.post({"task": "b", "agents": [agent("a")]}, headers=B)).json()
    assert created["queue_position"] == 1
    assert (await h.client.get(f"/swarms/{created['id']}", headers=B)).json()[
        "queue_position"] == 1
    assert [s["queue_position"] for s in (await h.client.get(
        "/swarms", headers=B)).json()["items"]] == [1]
    assert [s["queue_position"] for s in (await h.client.get(
        "/swarms", params={"status": "queued"}, headers=B)).json()["items"]] == [1]


ROUTES: list[tuple[str, str, Any]] = [
    ("POST", "/swarms", {"task": "t"}), ("GET", "/swarms", None),
    ("GET", "/swarms/{id}", None), ("GET", "/swarms/{id}?wait=1", None),
    ("POST", "/swarms/{id}/cancel", None), ("POST", "/swarms/{id}/retry", None),
    ("GET", "/swarms/{id}/events", None), ("GET", "/swarms/{id}/subtasks/a", None),
    ("GET", "/usage", None), ("GET", "/usage?group_by=tenant&from=bad", None),
    ("GET", "/tools", None), ("HEAD", "/swarms", None), ("HEAD", "/usage", None),
    ("POST", "/swarms", "not json"),
]
OPENAI: list[tuple[str, str, Any]] = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/chat/completions", {"model": "kimi-k2.5",
                                      "messages": [{"role": "user", "content": "x"}]}),
    ("POST", "/v1/chat/completions", {"model": "kimi-k2.5", "agent_swarm": {"enabled": True},
                                      "messages": [{"role": "user", "content": "x"}]}),
    ("POST", "/v1/chat/completions", {"bad": 1}),
]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"},
                                     {"Authorization": "Bearer "}, {"Authorization": "ka"},
                                     {"Authorization": "Bearer ka kb"}])
async def test_every_route_is_401_without_a_valid_key(two: Harness,
                                                      headers: dict[str, str]) -> None:
    h = two
    sid = (await h.post({"task": "t", "agents": [agent("a")]}, headers=A)).json()["id"]
    for method, path, body in ROUTES:
        kw: dict[str, Any] = ({"content": body, "headers": {**headers,
                               "Content-Type": "application/json"}} if isinstance(body, str)
                              else {"json": body} if body is not None else {})
        kw.setdefault("headers", headers)
        r = await h.client.request(method, path.replace("{id}", sid), **kw)
        assert r.status_code == 401, (method, path, r.status_code, r.text)
        if method != "HEAD":
            error_of(r, 401, "unauthorized")
        assert r.headers.get("www-authenticate", "").lower().startswith("bearer"), path
    for method, path, body in OPENAI:
        r = await h.client.request(method, path, headers=headers, json=body)
        assert r.status_code == 401, (path, r.status_code, r.text)
        err = r.json()["error"]
        assert set(err) >= {"message", "type", "code"}, r.text


async def test_facade_swarms_keys_and_ledger_rows_stay_in_their_tenant(two: Harness) -> None:
    h = two
    chat = {"model": "kimi-k2.5", "agent_swarm": {"enabled": True, "max_sub_agents": 2},
            "messages": [{"role": "user", "content": "plan it"}]}
    key = {"Idempotency-Key": "same"}
    a_post = await h.post({"task": "t", "agents": [agent("a")]}, headers={**A, **key})
    assert a_post.status_code == 202
    b_chat = await h.client.post("/v1/chat/completions", json=chat, headers={**B, **key})
    assert b_chat.status_code == 200, b_chat.text
    b_sid = b_chat.json()["swarm_id"]
    assert b_sid != a_post.json()["id"]
    error_of(await h.client.get(f"/swarms/{b_sid}", headers=A), 404, "not_found")
    assert b_sid in [s["id"] for s in (await h.client.get("/swarms", headers=B)).json()["items"]]
    assert b_sid not in [s["id"] for s in (await h.client.get("/swarms", headers=A)
                                          ).json()["items"]]
    # A replaying its key still gets its own swarm
    again = await h.post({"task": "t", "agents": [agent("a")]}, headers={**A, **key})
    assert again.json()["id"] == a_post.json()["id"]
    # passthrough, billed to B only
    await done(h, a_post.json()["id"], A)
    before_a = (await h.client.get("/usage", headers=A)).json()["total"]
    before_b = Decimal((await h.client.get("/usage", headers=B)).json()["total"]["cost_usd"])
    r = await h.client.post("/v1/chat/completions", headers=B, json={
        "model": "kimi-k2.5", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert (await h.client.get("/usage", headers=A)).json()["total"] == before_a
    after_b = (await h.client.get("/usage", params={"group_by": "tenant"}, headers=B)).json()
    assert [i["key"] for i in after_b["items"]] == ["b"]
    assert Decimal(after_b["total"]["cost_usd"]) > before_b
    a_done = await done(h, a_post.json()["id"], A)
    a_usage = (await h.client.get("/usage", headers=A)).json()["total"]
    assert Decimal(a_usage["cost_usd"]) == Decimal(a_done["usage"]["cost_usd"])


async def test_retry_keys_are_per_tenant(two: Harness) -> None:
    h = two
    bad_a = (await h.post({"task": "t", "agents": [agent("a", "[[sim fail=400]]")]},
                          headers=A)).json()["id"]
    bad_b = (await h.post({"task": "t", "agents": [agent("a", "[[sim fail=400]]")]},
                          headers=B)).json()["id"]
    await done(h, bad_a, A)
    await done(h, bad_b, B)
    key = {"Idempotency-Key": "r"}
    ra = await h.client.post(f"/swarms/{bad_a}/retry", headers={**A, **key})
    rb = await h.client.post(f"/swarms/{bad_b}/retry", headers={**B, **key})
    assert ra.status_code == rb.status_code == 202, (ra.text, rb.text)
    assert ra.json()["id"] != rb.json()["id"]
    # B using the key on A's swarm: 404, not a replay of anything
    error_of(await h.client.post(f"/swarms/{bad_a}/retry", headers={**B, **key}), 404,
             "not_found")


async def test_queue_position_without_quotas_one_statement_path(database_url: str,
                                                                tmp_path: Any) -> None:
    limits = tmp_path / "tenants.toml"
    limits.write_text("[defaults]\n")
    h, close = await start_harness(make_settings(database_url, api_keys="acmecorp:ka,globex:kb",
                                                 tenants_file=str(limits)), run_engine=False)
    try:
        for i in range(3):
            assert (await h.post({"task": f"a{i}"}, headers=A)).json()["queue_position"] == i + 1
        assert (await h.post({"task": "b"}, headers=B)).json()["queue_position"] == 1
        metrics = (await h.client.get("/metrics")).text
        assert "acmecorp" not in metrics and "globex" not in metrics
    finally:
        await close()


async def test_b_on_a_queued_swarm_is_404_and_changes_nothing(idle: Harness) -> None:
    h = idle
    sid = (await h.post({"task": "t", "agents": [agent("a")]}, headers=A)).json()["id"]
    for method, tail in (("POST", "/cancel"), ("POST", "/retry"), ("GET", "/subtasks/a"),
                         ("GET", "/events"), ("GET", "")):
        error_of(await h.client.request(method, f"/swarms/{sid}{tail}", headers=B), 404,
                 "not_found")
    mine = (await h.client.get(f"/swarms/{sid}", headers=A)).json()
    assert mine["status"] == "queued" and mine["queue_position"] == 1
    assert (await h.client.get("/swarms", params={"retry_of": sid}, headers=A)).json()[
        "items"] == []


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}])
async def test_a_malformed_body_without_a_valid_key_is_401(sqlite_url: str,
                                                           headers: dict[str, str]) -> None:
    """The key is checked before the body: FastAPI reads a body before it resolves
    dependencies, so without that retry and the facade answered 400 invalid_json."""
    h, close = await start_harness(make_settings(sqlite_url, api_keys="a:ka,b:kb"))
    sid = (await h.post({"task": "t", "agents": [agent("a")]}, headers=A)).json()["id"]
    got = {}
    for path in ("/swarms", f"/swarms/{sid}/retry", f"/swarms/{MISSING}/retry",
                 "/v1/chat/completions"):
        r = await h.client.post(path, content=b"{not json",
                                headers={**headers, "Content-Type": "application/json"})
        got[path] = r.status_code
    await close()
    assert set(got.values()) == {401}, got
