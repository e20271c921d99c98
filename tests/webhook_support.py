"""Helpers shared by the webhook tests: a scripted receiver on httpx.MockTransport, a harness
whose dispatcher sends to it, and a wait for a swarm's recorded attempts."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from sqlalchemy import select

from app.db.tables import WebhookAttempt
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


async def start(database_url: str, receiver: Receiver, **overrides: Any) -> tuple[Harness, Any]:
    settings = make_settings(database_url, webhook_secret=SECRET, webhook_allow_http=True,
                             webhook_allow_private=True, webhook_retry_base_s=0.05,
                             **overrides)
    return await start_harness(settings, webhook_transport=httpx.MockTransport(receiver.handler))


async def attempts(h: Harness, swarm_id: str, n: int) -> list[WebhookAttempt]:
    async def rows() -> list[WebhookAttempt] | None:
        async with h.app.state.sessions() as s:
            found = list((await s.execute(select(WebhookAttempt).where(
                WebhookAttempt.swarm_id == swarm_id).order_by(WebhookAttempt.attempt))).scalars())
        return found if len(found) >= n else None

    return await until(rows, 10, f"{n} webhook attempts")


async def assert_webhook_url_refused(database_url: str, url: str) -> None:
    """`POST /swarms` naming `url` as its webhook: 422 `invalid_webhook_url` on the field, and
    nothing stored for the refused request."""
    h, close = await start_harness(make_settings(database_url, webhook_secret=SECRET),
                                   run_engine=False)
    try:
        r = await h.post({"task": "t", "agents": [{"name": "a"}], "webhook_url": url})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "invalid_webhook_url"
        assert r.json()["error"]["details"]["field"] == "webhook_url"
        listed = (await h.client.get("/swarms")).json()["items"]
        assert listed == []
    finally:
        await close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One HTTP request off a receiver's connection: its head, then its body by Content-Length
    (the body is returned)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return await reader.readexactly(length)
