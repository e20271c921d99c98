"""Webhook signatures with a secret per tenant (SPEC §8's `webhook_secret`): each tenant's
deliveries are signed with its own secret, and a receiver checks them with it."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select

from app.db.tables import Webhook
from app.webhook_policy import SIGNATURE_HEADER as SIGNATURE
from app.webhook_policy import webhook_secret
from app.webhooks import WebhookDispatcher
from tests.conftest import make_settings, start_harness
from tests.helpers import until
from tests.webhook_support import SECRET, Receiver, attempts


def _verify(request: httpx.Request, secret: str) -> bool:
    t, v1 = (part.split("=", 1)[1] for part in request.headers[SIGNATURE].split(","))
    mac = hmac.new(secret.encode(), f"{t}.".encode() + request.content, hashlib.sha256)
    return hmac.compare_digest(v1, mac.hexdigest())


def test_a_tenant_secret_overrides_the_global_one() -> None:
    settings = make_settings("sqlite+aiosqlite://", webhook_secret=SECRET)
    assert webhook_secret(settings, "t1", {"t1": "s-t1"}) == "s-t1"
    assert webhook_secret(settings, "t2", {"t1": "s-t1"}) == SECRET
    assert webhook_secret(make_settings("sqlite+aiosqlite://"), "t2", {"t1": "s-t1"}) == ""


async def test_each_tenant_is_signed_with_its_own_secret(sqlite_url: str) -> None:
    settings = make_settings(sqlite_url, api_keys="t1:k1,t2:k2", webhook_secret=SECRET,
                             webhook_allow_http=True, webhook_allow_private=True)
    h, close = await start_harness(settings, run_engine=False)  # no dispatcher of its own
    receiver = Receiver([])
    hooks = WebhookDispatcher(settings, h.app.state.sessions,
                              transport=httpx.MockTransport(receiver.handler),
                              secrets={"t1": "s-t1"})
    try:
        for tenant in ("t1", "t2"):  # cancelling a queued swarm makes its delivery due
            auth = {"Authorization": f"Bearer k{tenant[1]}"}
            r = await h.post({"task": "t", "webhook_url": f"http://hooks.example/{tenant}"},
                             headers=auth)
            assert (await h.client.post(f"/swarms/{r.json()['id']}/cancel",
                                        headers=auth)).status_code == 202
        hooks.start()
        await until(lambda: len(receiver.requests) >= 2, 10, "both deliveries")
    finally:
        await hooks.stop()
        await close()
    sent = {r.url.path: r for r in receiver.requests}
    assert _verify(sent["/t1"], "s-t1") and not _verify(sent["/t1"], SECRET)
    assert _verify(sent["/t2"], SECRET)


def test_the_tenants_file_names_a_tenant_secret(tmp_path: Any) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text('[tenants.t1]\nwebhook_secret = "s-file"\n')
    settings = make_settings("sqlite+aiosqlite://", webhook_secret=SECRET,
                             tenants_file=str(path))
    assert webhook_secret(settings, "t1") == "s-file"
    assert webhook_secret(settings, "t2") == SECRET
    # a tenant secret alone is enough for that tenant's webhooks
    assert webhook_secret(make_settings("sqlite+aiosqlite://", tenants_file=str(path)),
                          "t1") == "s-file"


@pytest.mark.parametrize(("changed", "why"), [
    pytest.param({"webhook_secret": ""}, "no webhook secret", id="secret-removed"),
    pytest.param({"webhook_allow_http": False}, "http webhooks are not allowed",
                 id="http-no-longer-allowed"),
    # a URL only the sender refuses (checked at creation since)
    pytest.param({}, "InvalidURL", id="unparseable-url"),
])
async def test_a_delivery_the_policy_now_forbids_is_recorded_not_sent(
        sqlite_url: str, changed: dict[str, Any], why: str) -> None:
    """The policy in force at the send holds, not only the one at creation: a secret removed
    since (a signature over an empty key, which anyone can forge), http no longer allowed, a
    URL the sender cannot parse — each attempt recorded, so the hour's give-up applies."""
    created = make_settings(sqlite_url, webhook_secret=SECRET, webhook_allow_http=True,
                            webhook_allow_private=True)
    h, close = await start_harness(created, run_engine=False)  # no dispatcher of its own
    receiver = Receiver([])
    url = "http://hooks.example/x"
    now = created.model_copy(update={k: (SecretStr(v) if k == "webhook_secret" else v)
                                     for k, v in changed.items()})
    hooks = WebhookDispatcher(now, h.app.state.sessions,
                              transport=httpx.MockTransport(receiver.handler))
    try:
        r = await h.post({"task": "t", "webhook_url": url})
        swarm_id = r.json()["id"]
        assert (await h.client.post(f"/swarms/{swarm_id}/cancel")).status_code == 202
        if not changed:  # as a swarm created before the creation check existed
            async with h.app.state.sessions() as s, s.begin():
                hook = (await s.execute(select(Webhook))).scalar_one()
                hook.url = "http://hooks.example/a\x7fb"
        hooks.start()
        [attempt] = await attempts(h, swarm_id, 1)
    finally:
        await hooks.stop()
        await close()
    assert receiver.requests == []
    assert attempt.status_code is None and why in (attempt.error or ""), attempt.error


async def test_a_retry_holds_the_webhook_policy_in_force(sqlite_url: str) -> None:
    """A retry makes a new swarm: its webhook must pass today's policy, as POST /swarms'."""
    then = make_settings(sqlite_url, webhook_secret=SECRET, webhook_allow_http=True,
                         webhook_allow_private=True)
    h, close = await start_harness(then, run_engine=False)
    try:
        r = await h.post({"task": "t", "webhook_url": "http://hooks.example/x"})
        swarm_id = r.json()["id"]
        assert (await h.client.post(f"/swarms/{swarm_id}/cancel")).status_code == 202
    finally:
        await close()
    for now, code in ((make_settings(sqlite_url, webhook_secret=SECRET), "invalid_webhook_url"),
                      (make_settings(sqlite_url, webhook_allow_http=True,
                                     webhook_allow_private=True), "webhooks_not_configured")):
        h, close = await start_harness(now, run_engine=False)
        try:
            r = await h.client.post(f"/swarms/{swarm_id}/retry")
            assert r.status_code == 422, r.text
            assert r.json()["error"]["code"] == code
            assert r.json()["error"]["details"]["field"] == "webhook_url"
            assert len((await h.client.get("/swarms")).json()["items"]) == 1  # none made
        finally:
            await close()
