"""Signed webhooks on terminal states: URL checks, signatures, retries, recorded attempts."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select

from app.aio import wait_for
from app.db.tables import Webhook, WebhookAttempt
from app.webhook_policy import SIGNATURE_HEADER as SIGNATURE
from app.webhook_policy import sign, webhook_secret
from app.webhooks import WebhookDispatcher
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import until

SECRET = "whsec-test"


class Receiver:
    """A webhook endpoint: answers the scripted statuses in turn, then 200."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.requests: list[httpx.Request] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status = self.statuses.pop(0) if self.statuses else 200
        return httpx.Response(status, text="ok" if status < 300 else "nope")


async def _start(database_url: str, receiver: Receiver, **overrides: Any) -> tuple[Harness, Any]:
    settings = make_settings(database_url, webhook_secret=SECRET, webhook_allow_http=True,
                             webhook_allow_private=True, webhook_retry_base_s=0.05,
                             **overrides)
    return await start_harness(settings, webhook_transport=httpx.MockTransport(receiver.handler))


@pytest.fixture
async def flaky(database_url: str) -> AsyncIterator[tuple[Harness, Receiver]]:
    receiver = Receiver([500, 503])
    h, close = await _start(database_url, receiver)
    yield h, receiver
    await close()


async def _attempts(h: Harness, swarm_id: str, n: int) -> list[WebhookAttempt]:
    async def rows() -> list[WebhookAttempt] | None:
        async with h.app.state.sessions() as s:
            found = list((await s.execute(select(WebhookAttempt).where(
                WebhookAttempt.swarm_id == swarm_id).order_by(WebhookAttempt.attempt))).scalars())
        return found if len(found) >= n else None

    return await until(rows, 10, f"{n} webhook attempts")


async def test_terminal_swarm_is_posted_signed_and_retried_until_2xx(
        flaky: tuple[Harness, Receiver]) -> None:
    h, receiver = flaky
    data = await h.run({"task": "t", "agents": [{"name": "a"}],
                        "webhook_url": "http://hooks.example/swarm"})
    rows = await _attempts(h, data["id"], 3)
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
    h, close = await _start(database_url, receiver)
    try:
        await h.app.state.engine.stop()  # nothing claims: the swarm stays queued
        r = await h.post({"task": "t", "agents": [{"name": "a"}],
                          "webhook_url": "http://hooks.example/x"})
        swarm_id = r.json()["id"]
        assert (await h.client.post(f"/swarms/{swarm_id}/cancel")).status_code == 202
        assert (await h.client.get(f"/swarms/{swarm_id}")).json()["status"] == "cancelled"
        rows = await _attempts(h, swarm_id, 1)
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
    h, close = await _start(database_url, receiver)
    try:
        data = await h.run({"task": "t", "agents": [{"name": "a"}],
                            "webhook_url": "http://hooks.example/x"})
        await _attempts(h, data["id"], 1)
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


# ---- SSRF: IPv6 forms that embed IPv4, and one resolution per delivery -------------------------


@pytest.mark.parametrize("url", [
    "https://[::127.0.0.1]/x",                     # IPv4-compatible
    "https://[::ffff:127.0.0.1]/x",                # IPv4-mapped
    "https://[::ffff:a9fe:a9fe]/latest",           # mapped 169.254.169.254
    "https://[64:ff9b::7f00:1]/x",                 # NAT64 of 127.0.0.1
    "https://[64:ff9b::a00:1]/x",                  # NAT64 of 10.0.0.1
    "https://[64:ff9b:1::a00:1]/x",                # local-use NAT64
    "https://[2002:7f00:1::]/x",                   # 6to4 of 127.0.0.1
    "https://[2002:c0a8:101::1]/x",                # 6to4 of 192.168.1.1
    "https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/x",  # Teredo, client 127.0.0.1
    "https://[::]/x",
    "https://[fe80::1%25eth0]/x",
    "https://2130706433/x",                        # 127.0.0.1 as one number
    "https://0x7f.1/x",
    "https://[ff0e::1]/x",                         # multicast
    "https://[::1:8443/x",                         # not a URL at all
])
async def test_ipv6_forms_of_private_addresses_are_refused(sqlite_url: str, url: str) -> None:
    h, close = await start_harness(make_settings(sqlite_url, webhook_secret=SECRET),
                                   run_engine=False)
    try:
        r = await h.post({"task": "t", "agents": [{"name": "a"}], "webhook_url": url})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "invalid_webhook_url"
        assert r.json()["error"]["details"]["field"] == "webhook_url"
    finally:
        await close()


def test_embedded_ipv4_is_judged_like_the_ipv4_address() -> None:
    from app.outbound import refusal

    assert refusal("93.184.216.34") is None
    assert refusal("2606:2800:220:1:248:1893:25c8:1946") is None
    for private in ("::127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::", "::ffff:10.0.0.1",
                    "127.0.0.1", "10.1.2.3", "100.64.0.1", "0.0.0.0", "::1"):
        assert refusal(private) is not None, private


async def test_the_connection_goes_to_the_address_that_was_checked() -> None:
    """One resolution per request: a name that changes its answer between the check and the
    connection (DNS rebinding) cannot redirect the request."""
    from app.outbound import AddressRefused, PinnedTransport

    answers = [["93.184.216.34"], ["127.0.0.1"]]
    lookups: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        lookups.append(f"{host}:{port}")
        from app.outbound import refusal

        addrs = answers.pop(0)
        if any(refusal(a) for a in addrs):
            raise ValueError(f"{host!r} resolves to a non-public address")
        return addrs

    seen: list[httpx.Request] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    pinned = PinnedTransport(httpx.MockTransport(receiver), resolve=resolve)
    async with httpx.AsyncClient(transport=pinned) as client:
        r = await client.post("https://hooks.example/x", content=b"{}")
        assert r.status_code == 200
        with pytest.raises(AddressRefused):
            await client.post("https://hooks.example/x", content=b"{}")
    assert lookups == ["hooks.example:443", "hooks.example:443"]
    assert len(seen) == 1  # the refused one never left
    sent = seen[0]
    assert sent.url.host == "93.184.216.34" and sent.url.path == "/x"
    assert sent.headers["host"] == "hooks.example"
    assert sent.extensions["sni_hostname"] == "hooks.example"  # TLS checks the name


# ---- deliveries cannot be stalled --------------------------------------------------------------


class Receivers:
    """Real HTTP receivers on loopback: one trickles its answer a byte at a time, one answers
    50 MB, one answers at once."""

    FLOOD = 50 * 1024 * 1024

    def __init__(self) -> None:
        self.trickle_started = asyncio.Event()
        self.trickle_ended = asyncio.Event()
        self.flood_started = asyncio.Event()
        self.flood_sent = 0
        self.fast: list[bool] = []  # per fast delivery: was the trickle still going?
        self.servers: list[asyncio.Server] = []

    async def start(self) -> dict[str, str]:
        urls = {}
        for name, handler in (("trickle", self._trickle), ("flood", self._flood),
                              ("fast", self._fast)):
            server = await asyncio.start_server(handler, "127.0.0.1", 0)
            self.servers.append(server)
            urls[name] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
        return urls

    async def close(self) -> None:
        for server in self.servers:
            server.close()

    @staticmethod
    async def _request(reader: asyncio.StreamReader) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)

    async def _trickle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._request(reader)
        self.trickle_started.set()
        try:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            for _ in range(600):  # a byte every 0.1 s for a minute, unless the client leaves
                writer.write(b"x")
                await writer.drain()
                if reader.at_eof():
                    break
                await asyncio.sleep(0.1)
        except ConnectionError:
            pass
        finally:
            self.trickle_ended.set()
            writer.close()

    async def _flood(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._request(reader)
        self.flood_started.set()
        chunk = b"x" * (1024 * 1024)
        try:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.FLOOD)
            while self.flood_sent < self.FLOOD:
                writer.write(chunk)
                await writer.drain()
                self.flood_sent += len(chunk)
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _fast(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._request(reader)
        self.fast.append(not self.trickle_ended.is_set())
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        writer.close()


async def test_a_trickling_or_flooding_receiver_delays_no_other_delivery(
        database_url: str) -> None:
    receivers = Receivers()
    urls = await receivers.start()
    deadline = 5.0
    h, close = await start_harness(make_settings(
        database_url, webhook_secret=SECRET, webhook_allow_http=True, webhook_allow_private=True,
        webhook_timeout_s=deadline, webhook_retry_base_s=600))
    try:
        await h.app.state.engine.stop()  # swarms stay queued; cancelling one makes it due now
        ids = {name: (await h.post({"task": "t", "agents": [{"name": "a"}],
                                    "webhook_url": url})).json()["id"]
               for name, url in urls.items()}
        for name in ("trickle", "flood"):
            assert (await h.client.post(f"/swarms/{ids[name]}/cancel")).status_code == 202
        await wait_for(receivers.trickle_started.wait(), 20)
        await wait_for(receivers.flood_started.wait(), 20)
        # both slow deliveries are under way: the next one must not wait for them
        assert (await h.client.post(f"/swarms/{ids['fast']}/cancel")).status_code == 202
        rows = await _attempts(h, ids["fast"], 1)
        assert rows[0].status_code == 204
        assert receivers.fast == [True], "the fast delivery waited for the trickling one"
        trickle, flood = [(await _attempts(h, ids[n], 1))[0] for n in ("trickle", "flood")]
        # the receiver sees the connection go on its next byte or two
        await wait_for(receivers.trickle_ended.wait(), 10)
    finally:
        h.app.state.engine = None
        await close()
        await receivers.close()
    # the trickle was cut at the deadline (connect + send + read), not after a minute
    assert trickle.status_code is None and "within 5 s" in (trickle.error or "")
    assert deadline * 1000 <= (trickle.latency_ms or 0) < 4 * deadline * 1000
    # the flood's status was taken and its body left unread after a few chunks
    assert flood.status_code == 200
    assert receivers.flood_sent < Receivers.FLOOD // 2


# ---- a secret per tenant ---------------------------------------------------------------------


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
        [attempt] = await _attempts(h, swarm_id, 1)
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
