"""Signed webhooks on terminal states: URL checks, signatures, retries, recorded attempts
(addresses, stalls and per-tenant secrets: test_webhook_addresses, _stalls, _secrets)."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select

from app.db.tables import Webhook
from app.webhook_policy import sign
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import until
from tests.webhook_support import SECRET, Receiver, attempts, start


@pytest.fixture
async def flaky(database_url: str) -> AsyncIterator[tuple[Harness, Receiver]]:
    receiver = Receiver([500, 503])
    h, close = await start(database_url, receiver)
    yield h, receiver
    await close()


async def test_terminal_swarm_is_posted_signed_and_retried_until_2xx(
        flaky: tuple[Harness, Receiver]) -> None:
    h, receiver = flaky
    data = await h.run({"task": "t", "agents": [{"name": "a"}],
                        "webhook_url": "http://hooks.example/swarm"})
    rows = await attempts(h, data["id"], 3)
    assert [r.status_code for r in rows] == [500, 503, 200]
    assert [r.attempt for r in rows] == [1, 2, 3]
    async with h.app.state.sessions() as s:
        hook = (await s.execute(select(Webhook))).scalar_one()
    assert hook.state == "delivered" and hook.attempts == 3
    last = receiver.requests[-1]
    assert str(last.url) == "http://hooks.example/swarm"
    t, v1 = (part.split("=", 1)[1] for part in last.headers["X-Swarm-Signature"].split(","))
    expected = hmac.new(SECRET.encode(), f"{t}.".encode() + last.content,
                        hashlib.sha256).hexdigest()
    assert hmac.compare_digest(v1, expected)
    payload = json.loads(last.content)
    assert payload["id"] == data["id"] and payload["status"] == "succeeded"
    assert payload["result"] == data["result"]
    assert all(s["output"] is None for s in payload["subtasks"])  # without subtask outputs


async def test_cancelled_queued_swarm_is_delivered_too(database_url: str) -> None:
    receiver = Receiver([])
    h, close = await start(database_url, receiver)
    try:
        await h.app.state.engine.stop()  # nothing claims: the swarm stays queued
        r = await h.post({"task": "t", "agents": [{"name": "a"}],
                          "webhook_url": "http://hooks.example/x"})
        swarm_id = r.json()["id"]
        assert (await h.client.post(f"/swarms/{swarm_id}/cancel")).status_code == 202
        assert (await h.client.get(f"/swarms/{swarm_id}")).json()["status"] == "cancelled"
        rows = await attempts(h, swarm_id, 1)
        assert rows[0].status_code == 200
        assert json.loads(receiver.requests[0].content)["status"] == "cancelled"
    finally:
        h.app.state.engine = None
        await close()


def test_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"id":"x"}'
    mac = hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign("k", body, 1700000000) == f"t=1700000000,v1={mac}"


@pytest.mark.parametrize("url,code", [
    ("http://hooks.example/x", "invalid_webhook_url"),          # http not allowed
    ("https://127.0.0.1/x", "invalid_webhook_url"),             # loopback
    ("https://10.1.2.3/x", "invalid_webhook_url"),              # private
    ("https://169.254.169.254/latest", "invalid_webhook_url"),  # link-local metadata
    ("https://[::1]/x", "invalid_webhook_url"),
    ("https://localhost/x", "invalid_webhook_url"),
    ("https://user:pw@hooks.example/x", "invalid_webhook_url"),
    ("ftp://hooks.example/x", "invalid_webhook_url"),
    ("not a url", "invalid_webhook_url"),
    # what urlsplit passes and the sender's parser refuses: it would never be sent
    ("https://8.8.8.8/a\x7fb", "invalid_webhook_url"),
    ("https://8.8.8.8/a\tb", "invalid_webhook_url"),
])
async def test_unsafe_webhook_urls_are_rejected(sqlite_url: str, url: str, code: str) -> None:
    h, close = await start_harness(make_settings(sqlite_url, webhook_secret=SECRET))
    try:
        r = await h.post({"task": "t", "agents": [{"name": "a"}], "webhook_url": url})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == code
        assert r.json()["error"]["details"]["field"] == "webhook_url"
        assert (await h.client.get("/swarms")).json()["items"] == []
    finally:
        await close()


async def test_webhooks_need_a_secret(sqlite_url: str) -> None:
    h, close = await start_harness(make_settings(sqlite_url, webhook_allow_private=True))
    try:
        r = await h.post({"task": "t", "agents": [{"name": "a"}],
                          "webhook_url": "https://hooks.example/x"})
        assert r.status_code == 422
        assert r.json()["error"]["code"] == "webhooks_not_configured"
    finally:
        await close()


async def test_delivery_gives_up_after_an_hour(database_url: str) -> None:
    receiver = Receiver([500] * 50)
    h, close = await start(database_url, receiver)
    try:
        data = await h.run({"task": "t", "agents": [{"name": "a"}],
                            "webhook_url": "http://hooks.example/x"})
        await attempts(h, data["id"], 1)
        # a year old and due at once: an attempt in flight as it changes no longer matches the
        # row (its created_at) and leaves it, so the next claim decides, not that attempt's hold
        async with h.app.state.sessions() as s, s.begin():
            hook = (await s.execute(select(Webhook))).scalar_one()
            hook.created_at = hook.created_at.replace(year=hook.created_at.year - 1)
            hook.next_attempt_at = hook.created_at

        async def settled() -> Webhook | None:
            async with h.app.state.sessions() as s:
                hook = (await s.execute(select(Webhook))).scalar_one()
            return hook if hook.state != "pending" else None

        hook = await until(settled, 10, "the webhook to leave pending")
        assert hook.state == "failed" and hook.finished_at is not None
    finally:
        await close()
