"""The webhook sender: a durable retry loop over delivery rows (any process with an engine
sends them), signed per app/webhook_policy.py. Each delivery runs on its own, under one deadline for
connect + send + read, and reads at most MAX_ANSWER_BYTES of the answer: a receiver that
trickles or floods delays nobody else's delivery. Deliveries are taken round-robin across
tenants and no tenant holds more than SWARM_WEBHOOK_TENANT_CONCURRENCY of the process's
SWARM_WEBHOOK_CONCURRENCY slots: a tenant whose receiver never answers waits for its own
(SPEC §8)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Mapping

import httpx

from app import logs
from app.aio import woken
from app.config import Settings
from app.db import queries
from app.db import webhooks as repo
from app.db.retry import log_db_failure
from app.db.session import SessionFactory
from app.db.tables import Webhook
from app.outbound import PinnedTransport
from app.views import swarm_json
from app.webhook_policy import SIGNATURE_HEADER, send_refusal, sign, webhook_secret

log = logging.getLogger(__name__)
GIVE_UP_AFTER_S = 3600.0  # SPEC: non-2xx answers are retried for up to an hour
HOLD_SLACK_S = 30.0       # a claimed delivery is ours for its deadline plus this
MAX_ANSWER_BYTES = 64 * 1024  # of a receiver's answer body; only its status matters


class WebhookDispatcher:
    """Sends due deliveries, each in its own task (at most SWARM_WEBHOOK_CONCURRENCY at once,
    SWARM_WEBHOOK_TENANT_CONCURRENCY of one tenant), retries non-2xx with backoff up to an
    hour, records every attempt."""

    def __init__(self, settings: Settings, sessions: SessionFactory,
                 transport: httpx.AsyncBaseTransport | None = None,
                 secrets: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.sessions = sessions
        self.deadline_s = settings.webhook_timeout_s
        if not settings.webhook_allow_private:  # connect only to the address that was checked
            transport = PinnedTransport(transport)
        # httpx's timeouts bound each phase (a trickle of bytes resets the read timeout);
        # the deadline in _post bounds the whole attempt
        self._client = httpx.AsyncClient(transport=transport, timeout=self.deadline_s,
                                         follow_redirects=False)
        self._secrets = secrets
        self._poll_s = settings.poll_interval_s
        self._concurrency = settings.webhook_concurrency
        self._per_tenant = settings.webhook_tenant_concurrency
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: dict[asyncio.Task[None], str] = {}  # -> its tenant
        self._busy: Counter[str] = Counter()  # deliveries in flight, by tenant

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="webhooks")

    async def stop(self) -> None:
        """Stop claiming and cancel what is in flight (its hold expires; it is sent again)."""
        tasks = [t for t in (self._task, *self._inflight) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._client.aclose()

    async def _loop(self) -> None:
        while True:
            due: list[Webhook] = []
            free = self._concurrency - len(self._inflight)
            if free > 0:
                try:
                    async with self.sessions() as session, session.begin():
                        due = await repo.claim_due(session, free,
                                                   self.deadline_s + HOLD_SLACK_S,
                                                   self._per_tenant, self._busy)
                except Exception as exc:
                    log_db_failure(log, "claiming webhook deliveries", exc)
            for hook in due:
                task = asyncio.create_task(self._deliver(hook), name=f"webhook {hook.swarm_id}")
                self._inflight[task] = hook.tenant
                self._busy[hook.tenant] += 1
                task.add_done_callback(self._finished)
            if not due:  # nothing due, no free slot, or only tenants at their cap: until a
                # wake-up (a slot is free) or a poll
                await woken(self._wake, self._poll_s)
                self._wake.clear()

    def _finished(self, task: asyncio.Task[None]) -> None:
        tenant = self._inflight.pop(task)
        self._busy[tenant] -= 1
        if not self._busy[tenant]:
            del self._busy[tenant]
        self._wake.set()  # a slot is free

    async def _deliver(self, hook: Webhook) -> None:
        logs.bind(swarm_id=hook.swarm_id)  # this task's lines (its tenant once read)
        try:
            await self._attempt(hook)
        except asyncio.CancelledError:
            raise
        except Exception:  # the row stays held, then due again: another attempt follows
            log.exception("webhook %s: delivery failed", hook.swarm_id)

    async def _attempt(self, hook: Webhook) -> None:
        async with self.sessions() as session, session.begin():
            swarm = await queries.get_swarm(session, hook.swarm_id, None)
            subs = (await queries.subtask_views(session, [hook.swarm_id],
                                                outputs=False))[hook.swarm_id]
        assert swarm is not None
        if swarm.erased_at is not None:  # erased since it was claimed: never sent again
            return
        logs.bind(tenant=swarm.tenant, traceparent=swarm.trace_parent)
        body = swarm_json(swarm, subs, with_outputs=False, with_result=True)
        secret = webhook_secret(self.settings, swarm.tenant, self._secrets)
        t0 = time.perf_counter()
        refusal = send_refusal(hook.url, self.settings, secret)
        status, error = (None, refusal) if refusal else await self._post(hook, body, secret)
        latency_ms = round((time.perf_counter() - t0) * 1000, 1)
        base = self.settings.webhook_retry_base_s
        delay = min(base * 2 ** hook.attempts, 600.0) * (0.8 + 0.4 * random.random())
        async with self.sessions() as session, session.begin():
            state = await repo.record_attempt(session, hook, status, error, latency_ms, delay,
                                              GIVE_UP_AFTER_S)
        # the result, never the URL (a chat tool's webhook URL is its secret)
        result = str(status) if status else (error or "").partition(":")[0]
        log.info("webhook %s attempt %d: %s -> %s", hook.swarm_id, hook.attempts + 1,
                 result, state, extra={"attempt": hook.attempts + 1, "http_status": status,
                                       "result": result, "state": str(state),
                                       "latency_ms": latency_ms})

    async def _post(self, hook: Webhook, body: bytes,
                    secret: str) -> tuple[int | None, str | None]:
        ts = int(time.time())
        headers = {"content-type": "application/json",
                   SIGNATURE_HEADER: sign(secret, body, ts),
                   "X-Swarm-Event": "swarm.completed",
                   "X-Swarm-Delivery": f"{hook.swarm_id}:{hook.attempts + 1}"}
        try:
            async with asyncio.timeout(self.deadline_s):  # connect + send + read, in total
                async with self._client.stream("POST", hook.url, content=body,
                                               headers=headers) as r:
                    await _read_capped(r, MAX_ANSWER_BYTES)
        except (TimeoutError, httpx.TimeoutException):
            return None, f"no complete answer within {self.deadline_s:g} s"
        except Exception as exc:  # httpx's errors, and a URL it or IDNA cannot encode
            return None, f"{type(exc).__name__}: {exc}"[:500]
        return r.status_code, None if r.is_success else f"HTTP {r.status_code}"


async def _read_capped(response: httpx.Response, limit: int) -> int:
    """Read at most `limit` bytes of the body (undecoded: no decompression bomb either);
    closing the response then drops the connection instead of draining the rest."""
    seen = 0
    try:
        async for chunk in response.aiter_raw():
            seen += len(chunk)
            if seen >= limit:
                break
    except httpx.StreamConsumed:  # a transport that answered with the body already read
        seen = len(response.content)
    return seen
