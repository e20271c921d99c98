"""Helpers shared by the webhook tests: a scripted receiver on httpx.MockTransport, a harness
whose dispatcher sends to it, and a wait for a swarm's recorded attempts."""

from __future__ import annotations

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
