"""`SwarmClient`: the blocking client of the Swarm API."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from datetime import date, datetime
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from httpx_sse import EventSource
from pydantic import BaseModel
from tenacity import Retrying

import swarm_api_client._base as b
from app.estimate_schemas import SwarmEstimate
from app.schemas import (
    AuditEntry,
    AuditPage,
    SubtaskDetail,
    SwarmCreate,
    SwarmEvent,
    SwarmList,
    SwarmRead,
    ToolList,
    UsageReport,
)
from swarm_api_client.errors import SwarmApiError, WaitTimeout

M = TypeVar("M", bound=BaseModel)


class SwarmClient:
    """Blocking client. `base_url` and `api_key` default to SWARM_URL and SWARM_API_KEY.

    Every call retries 429/502/503/504 and connection errors (honouring `Retry-After`) and
    raises a `SwarmApiError` subclass carrying the SPEC's error code otherwise.
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float = 30.0, retry: b.RetryPolicy | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url, headers = b.settings(base_url, api_key)
        self.retry_policy = retry or b.RetryPolicy()
        self._timeout = timeout
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout,
                                  transport=transport)

    def __enter__(self) -> SwarmClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ---- the methods ---------------------------------------------------------------------

    def create(self, swarm: SwarmCreate | Mapping[str, Any], *,
               idempotency_key: str | None = None) -> SwarmRead:
        """`POST /swarms`; an Idempotency-Key (generated unless given) makes retries safe."""
        return self._call(b.create_call(swarm, idempotency_key), SwarmRead)

    def estimate(self, swarm: SwarmCreate | Mapping[str, Any]) -> SwarmEstimate:
        """`POST /swarms/estimate`: the plan, calls, tokens and cost (expected, p90, max) a
        swarm of this body would have, creating nothing (SPEC §14). Named agents cost
        nothing; without agents the planner runs, billed (`planning_cost_usd`)."""
        return self._call(b.estimate_call(swarm), SwarmEstimate)

    def get(self, swarm_id: str, *, wait: float | None = None) -> SwarmRead:
        """`GET /swarms/{id}`; `wait` (≤ 60 s) holds the answer until the swarm is terminal."""
        return self._call(b.get_call(swarm_id, wait, self._timeout), SwarmRead)

    def wait(self, swarm_id: str, *, timeout: float | None = 600.0,
             poll_s: float = b.MAX_SERVER_WAIT_S) -> SwarmRead:
        """Long-poll until the swarm is terminal; `WaitTimeout` after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
            swarm = self.get(swarm_id, wait=max(left, 0.0))
            if swarm.status in b.TERMINAL:
                return swarm
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"swarm {swarm_id} is still {swarm.status} after {timeout}s",
                                  code="wait_timeout", details={"status": swarm.status})

    def list(self, *, status: str | None = None, limit: int | None = None,
             page_size: int = 50) -> Iterator[SwarmRead]:
        """The tenant's swarms, newest first, page after page (without outputs): at most
        `limit` of them (None: every one), read `page_size` a request."""
        pages = b.Pages(status, limit, page_size)
        while (call := pages.next_call()) is not None:
            yield from pages.take(self._call(call, SwarmList))

    def cancel(self, swarm_id: str) -> SwarmRead:
        """`POST /swarms/{id}/cancel`; `Conflict` (`already_terminal`) when it already ended."""
        return self._call(b.cancel_call(swarm_id), SwarmRead)

    def erase(self, swarm_id: str) -> None:
        """`DELETE /swarms/{id}`: erase an ended swarm's content (its usage stays);
        `Conflict` (`not_terminal`) while it runs. Erasing it again is no error."""
        self._send(b.erase_call(swarm_id))

    def retry(self, swarm_id: str, *, limits: Mapping[str, Any] | None = None,
              idempotency_key: str | None = None) -> SwarmRead:
        """`POST /swarms/{id}/retry`: a new swarm reusing what succeeded (SPEC §11)."""
        return self._call(b.retry_call(swarm_id, limits, idempotency_key), SwarmRead)

    def approve(self, swarm_id: str, *, agents: Sequence[Mapping[str, Any]] | None = None,
                limits: Mapping[str, Any] | None = None) -> SwarmRead:
        """`POST /swarms/{id}/approve`: a swarm awaiting approval runs; with `agents`, exactly
        that plan (SPEC §14). `Conflict` (`not_awaiting_approval`) when it is not waiting."""
        return self._call(b.approve_call(swarm_id, agents, limits), SwarmRead)

    def reject(self, swarm_id: str, *, reason: str | None = None) -> SwarmRead:
        """`POST /swarms/{id}/reject`: a swarm awaiting approval ends `cancelled`
        (`rejected`). `Conflict` (`not_awaiting_approval`) when it is not waiting."""
        return self._call(b.reject_call(swarm_id, reason), SwarmRead)

    def usage(self, *, start: date | datetime | str | None = None,
              end: date | datetime | str | None = None, group_by: str = "model") -> UsageReport:
        """`GET /usage?from=&to=&group_by=`: spend and tokens from the ledger."""
        return self._call(b.usage_call(start, end, group_by), UsageReport)

    def audit(self, *, start: date | datetime | str | None = None,
              end: date | datetime | str | None = None, action: str | None = None,
              limit: int = 100, cursor: str | None = None) -> AuditPage:
        """`GET /audit?from=&to=&action=&limit=&cursor=`: one page of the tenant's audit
        trail, newest first (the key needs the scope `audit:read`)."""
        return self._call(b.audit_call(start, end, action, limit, cursor), AuditPage)

    def audit_entries(self, *, start: date | datetime | str | None = None,
                      end: date | datetime | str | None = None, action: str | None = None,
                      limit: int | None = None) -> Iterator[AuditEntry]:
        """The audit trail page after page, newest first: at most `limit` rows (None: all)."""
        cursor: str | None = None
        left = limit
        while left is None or left > 0:
            size = b.MAX_PAGE if left is None else min(left, b.MAX_PAGE)
            page = self.audit(start=start, end=end, action=action, limit=size, cursor=cursor)
            yield from page.items
            if left is not None:
                left -= len(page.items)
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def subtask(self, swarm_id: str, name: str) -> SubtaskDetail:
        """`GET /swarms/{id}/subtasks/{name}`: one subtask with its transcript (SPEC §9)."""
        path = b.swarm_path(swarm_id, f"/subtasks/{quote(name, safe='')}")
        return self._call(b.Call("GET", path), SubtaskDetail)

    def tools(self) -> ToolList:
        """`GET /tools`: the tools the MCP servers offer (SPEC §9)."""
        return self._call(b.Call("GET", "/tools"), ToolList)

    def events(self, swarm_id: str, *, last_event_id: int | None = None) -> Iterator[SwarmEvent]:
        """The swarm's events until `swarm.completed`; a dropped connection is resumed with
        `Last-Event-ID`, so every event comes once and in order."""
        last, failures = last_event_id, 0
        while True:
            got = 0
            try:
                with contextlib.closing(self._stream(swarm_id, last)) as stream:
                    for event in stream:
                        last, got, failures = event.id, got + 1, 0
                        yield event
                        if event.event == "swarm.completed":
                            return
            except Exception as exc:
                failures += 1
                if not b.retryable(exc) or failures > self.retry_policy.max_retries:
                    if isinstance(exc, b.TRANSIENT):
                        raise self._unreachable(exc) from exc
                    raise
                time.sleep(self.retry_policy.delay(failures, exc))
                continue
            if got == 0:
                # a clean end with nothing new: the swarm ended before `last`, or a server
                # going away (graceful shutdown) closed the stream
                if self.get(swarm_id).status in b.TERMINAL:
                    return
                failures += 1
                if failures > self.retry_policy.max_retries:
                    raise SwarmApiError(f"the event stream of {swarm_id} keeps ending early",
                                        code="stream_ended")
                time.sleep(self.retry_policy.delay(failures, None))

    # ---- plumbing ------------------------------------------------------------------------

    def _stream(self, swarm_id: str, last: int | None) -> Generator[SwarmEvent, None, None]:
        with self._http.stream("GET", b.swarm_path(swarm_id, "/events"),
                               headers=b.events_headers(last),
                               timeout=b.stream_timeout(self._timeout)) as response:
            if not response.is_success:
                response.read()
                b.check(response)
            for sse in EventSource(response).iter_sse():
                if b.is_event(sse):
                    yield b.to_event(sse)

    def _call(self, call: b.Call, model: type[M]) -> M:
        return b.parse(model, self._send(call))

    def _send(self, call: b.Call) -> httpx.Response:
        try:
            response: httpx.Response = Retrying(**self.retry_policy.tenacity())(
                self._attempt, call)
        except b.TRANSIENT as exc:
            raise self._unreachable(exc) from exc
        return response

    def _attempt(self, call: b.Call) -> httpx.Response:
        response = self._http.request(
            call.method, call.path, params=call.params, json=call.json, headers=call.headers,
            timeout=call.timeout if call.timeout is not None else httpx.USE_CLIENT_DEFAULT)
        return b.check(response)

    def _unreachable(self, exc: BaseException) -> Exception:
        return b.unreachable(self.base_url, exc)
