"""Signed webhooks for terminal swarms: URL checks at creation, HMAC signatures, and a durable
retry loop (deliveries are rows; any process with an engine sends them)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import random
import socket
import time
from urllib.parse import urlsplit

import httpx

from app.config import Settings
from app.db import queries
from app.db import webhooks as repo
from app.db.session import SessionFactory
from app.db.tables import Webhook
from app.errors import RequestInvalid
from app.views import swarm_read

log = logging.getLogger(__name__)
SIGNATURE_HEADER = "X-Swarm-Signature"
GIVE_UP_AFTER_S = 3600.0  # SPEC: non-2xx answers are retried for up to an hour
HOLD_S = 60.0             # a claimed delivery is ours for this long (one attempt's timeout + slack)


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """`t=<unix>,v1=<hex HMAC-SHA256 of "t.body">`, as receivers verify it."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def _invalid(message: str, url: str) -> RequestInvalid:
    return RequestInvalid(message, code="invalid_webhook_url",
                          details={"field": "webhook_url", "url": url})


async def public_addresses(host: str, port: int) -> list[str]:
    """Every address `host` resolves to; raises ValueError when one of them is not public."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port,
                                                              type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ValueError(f"cannot resolve {host!r}") from exc
    addrs = sorted({str(info[4][0]) for info in infos})
    for a in addrs:
        if not ipaddress.ip_address(a.split("%", 1)[0]).is_global:
            raise ValueError(f"{host!r} resolves to a non-public address ({a})")
    return addrs


async def check_webhook_url(url: str, settings: Settings) -> None:
    """Reject at creation what could never be delivered, or must not be (SSRF)."""
    if not settings.webhook_secret.get_secret_value():
        raise RequestInvalid("webhooks need SWARM_WEBHOOK_SECRET on the server",
                             code="webhooks_not_configured", details={"field": "webhook_url"})
    parts = urlsplit(url)
    allowed = {"https", "http"} if settings.webhook_allow_http else {"https"}
    if parts.scheme not in allowed or not parts.hostname:
        raise _invalid(f"webhook_url must be an absolute {' or '.join(sorted(allowed))} URL", url)
    if parts.username or parts.password:
        raise _invalid("webhook_url must not carry credentials", url)
    if not settings.webhook_allow_private:
        try:
            await public_addresses(parts.hostname, parts.port or 443)
        except ValueError as exc:
            raise _invalid(str(exc), url) from exc


class WebhookDispatcher:
    """Sends due deliveries, retries non-2xx with backoff up to an hour, records every attempt."""

    def __init__(self, settings: Settings, sessions: SessionFactory,
                 transport: httpx.AsyncBaseTransport | None = None,
                 concurrency: int = 16) -> None:
        self.settings = settings
        self.sessions = sessions
        self._client = httpx.AsyncClient(transport=transport, timeout=10.0,
                                         follow_redirects=False)
        self._poll_s = settings.poll_interval_s
        self._concurrency = concurrency
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="webhooks")

    def wake(self, _swarm_id: str = "") -> None:
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.aclose()

    async def _loop(self) -> None:
        while True:
            try:
                async with self.sessions() as session, session.begin():
                    due = await repo.claim_due(session, self._concurrency, HOLD_S)
                await asyncio.gather(*(self._deliver(h) for h in due))
            except Exception:
                log.exception("webhook loop failed; retrying")
                due = []
            if not due:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._poll_s)
                self._wake.clear()

    async def _deliver(self, hook: Webhook) -> None:
        async with self.sessions() as session, session.begin():
            swarm = await queries.get_swarm(session, hook.swarm_id, None)
            subs = (await queries.get_subtasks(session, [hook.swarm_id]))[hook.swarm_id]
        assert swarm is not None
        view = swarm_read(swarm, subs, with_outputs=False, with_result=True)
        body = json.dumps(view.model_dump(mode="json"), separators=(",", ":")).encode()
        t0 = time.perf_counter()
        status, error = await self._post(hook, body)
        latency_ms = round((time.perf_counter() - t0) * 1000, 1)
        base = self.settings.webhook_retry_base_s
        delay = min(base * 2 ** hook.attempts, 600.0) * (0.8 + 0.4 * random.random())
        async with self.sessions() as session, session.begin():
            state = await repo.record_attempt(session, hook, status, error, latency_ms, delay,
                                              GIVE_UP_AFTER_S)
        log.info("webhook %s attempt %d: %s -> %s", hook.swarm_id, hook.attempts + 1,
                 status or error, state)

    async def _post(self, hook: Webhook, body: bytes) -> tuple[int | None, str | None]:
        parts = urlsplit(hook.url)
        if not self.settings.webhook_allow_private:
            try:  # checked again at send time: DNS may have changed since creation
                await public_addresses(parts.hostname or "", parts.port or 443)
            except ValueError as exc:
                return None, f"refused: {exc}"
        ts = int(time.time())
        headers = {"content-type": "application/json",
                   SIGNATURE_HEADER: sign(self.settings.webhook_secret.get_secret_value(), body,
                                          ts),
                   "X-Swarm-Event": "swarm.completed",
                   "X-Swarm-Delivery": f"{hook.swarm_id}:{hook.attempts + 1}"}
        try:
            r = await self._client.post(hook.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"[:500]
        return r.status_code, None if r.is_success else f"HTTP {r.status_code}"
