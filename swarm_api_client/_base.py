"""What the sync and async clients share: settings, the retry policy, the requests of each
method, and answers turned into the service's own models or typed errors."""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from httpx_sse import ServerSentEvent
from pydantic import BaseModel
from tenacity import RetryCallState, retry_if_exception, stop_after_attempt

from app.schemas import SwarmCreate, SwarmEvent, SwarmList, SwarmRead
from swarm_api_client.errors import ConnectionFailed, SwarmApiError, error_from_response

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_SERVER_WAIT_S = 60.0  # the ceiling of `GET /swarms/{id}?wait=`
STREAM_READ_TIMEOUT_S = 60.0  # the server pings an idle event stream every 15 s
# errors after which the request may have reached the server or not: safe to resend because
# reads are idempotent and writes carry an Idempotency-Key
TRANSIENT = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class RetryPolicy:
    """429/502/503/504 and connection errors are retried: `Retry-After` when the server gives
    one (capped at `max_retry_after_s`), else exponential backoff with full jitter."""

    max_retries: int = 4
    backoff_s: float = 0.25
    max_backoff_s: float = 5.0
    max_retry_after_s: float = 60.0

    def delay(self, failures: int, exc: BaseException | None) -> float:
        """Seconds to wait before attempt `failures + 1`."""
        after = exc.retry_after if isinstance(exc, SwarmApiError) else None
        if after is not None:
            return min(after, self.max_retry_after_s)
        return random.uniform(0, min(self.max_backoff_s, self.backoff_s * 2 ** (failures - 1)))

    def tenacity(self) -> dict[str, Any]:
        """Keyword arguments for tenacity's `Retrying` / `AsyncRetrying`."""

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            return self.delay(state.attempt_number, exc)

        return {"retry": retry_if_exception(retryable), "wait": wait, "reraise": True,
                "stop": stop_after_attempt(self.max_retries + 1)}


def retryable(exc: BaseException) -> bool:
    if isinstance(exc, SwarmApiError):
        return exc.status_code in RETRY_STATUSES
    return isinstance(exc, TRANSIENT)


@dataclass
class Call:
    """One request of a client method."""

    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None  # None: the client's default


def settings(base_url: str | None, api_key: str | None) -> tuple[str, dict[str, str]]:
    """The base URL and headers: arguments first, then SWARM_URL / SWARM_API_KEY."""
    url = (base_url or os.environ.get("SWARM_URL") or DEFAULT_URL).rstrip("/")
    key = api_key if api_key is not None else os.environ.get("SWARM_API_KEY") or None
    headers = {"Accept": "application/json", "User-Agent": "swarm-api-client/0.1"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return url, headers


def swarm_path(swarm_id: str, suffix: str = "") -> str:
    return f"/swarms/{quote(swarm_id, safe='')}{suffix}"


def new_key() -> str:
    return f"swarm-api-client-{uuid.uuid4()}"


def create_call(swarm: SwarmCreate | Mapping[str, Any], key: str | None) -> Call:
    body = (swarm.model_dump(mode="json", exclude_unset=True) if isinstance(swarm, SwarmCreate)
            else dict(swarm))
    # one key for every attempt of this call: a retry after a lost answer replays the swarm
    return Call("POST", "/swarms", json=body, headers={"Idempotency-Key": key or new_key()})


def estimate_call(swarm: SwarmCreate | Mapping[str, Any]) -> Call:
    body = (swarm.model_dump(mode="json", exclude_unset=True) if isinstance(swarm, SwarmCreate)
            else dict(swarm))
    return Call("POST", "/swarms/estimate", json=body)


def get_call(swarm_id: str, wait: float | None, timeout: float) -> Call:
    if wait is None:
        return Call("GET", swarm_path(swarm_id))
    wait = min(max(wait, 0.0), MAX_SERVER_WAIT_S)
    return Call("GET", swarm_path(swarm_id), params={"wait": wait}, timeout=wait + timeout)


def list_call(status: str | None, cursor: str | None, page_size: int) -> Call:
    params: dict[str, Any] = {"limit": page_size}
    if status is not None:
        params["status"] = status
    if cursor is not None:
        params["cursor"] = cursor
    return Call("GET", "/swarms", params=params)


MAX_PAGE = 200  # the route's largest `limit`


class Pages:
    """The requests of `list`: page after page until the last page or `limit` swarms."""

    def __init__(self, status: str | None, limit: int | None, page_size: int) -> None:
        if limit is not None and limit < 0:
            raise ValueError("limit must be at least 0")
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self.status, self.left, self.page_size = status, limit, min(page_size, MAX_PAGE)
        self.cursor: str | None = None
        self.done = limit == 0

    def next_call(self) -> Call | None:
        if self.done:
            return None
        size = self.page_size if self.left is None else min(self.page_size, self.left)
        return list_call(self.status, self.cursor, size)

    def take(self, page: SwarmList) -> list[SwarmRead]:
        items = page.items if self.left is None else page.items[: self.left]
        if self.left is not None:
            self.left -= len(items)
        self.cursor = page.next_cursor
        self.done = page.next_cursor is None or self.left == 0
        return items


def cancel_call(swarm_id: str) -> Call:
    return Call("POST", swarm_path(swarm_id, "/cancel"))


def erase_call(swarm_id: str) -> Call:
    return Call("DELETE", swarm_path(swarm_id))


def retry_call(swarm_id: str, limits: Mapping[str, Any] | None, key: str | None) -> Call:
    body = {} if limits is None else {"limits": dict(limits)}
    return Call("POST", swarm_path(swarm_id, "/retry"), json=body,
                headers={"Idempotency-Key": key or new_key()})


def approve_call(swarm_id: str, agents: Sequence[Mapping[str, Any]] | None,
                 limits: Mapping[str, Any] | None) -> Call:
    body: dict[str, Any] = {}
    if agents is not None:
        body["agents"] = [dict(a) for a in agents]
    if limits is not None:
        body["limits"] = dict(limits)
    return Call("POST", swarm_path(swarm_id, "/approve"), json=body)


def reject_call(swarm_id: str, reason: str | None) -> Call:
    return Call("POST", swarm_path(swarm_id, "/reject"),
                json={} if reason is None else {"reason": reason})


def _instant(value: date | datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, (date, datetime)) else value


def usage_call(start: date | datetime | str | None, end: date | datetime | str | None,
               group_by: str) -> Call:
    params: dict[str, Any] = {"group_by": group_by}
    if (s := _instant(start)) is not None:
        params["from"] = s
    if (e := _instant(end)) is not None:
        params["to"] = e
    return Call("GET", "/usage", params=params)


def audit_call(start: date | datetime | str | None, end: date | datetime | str | None,
               action: str | None, limit: int, cursor: str | None) -> Call:
    params: dict[str, Any] = {"limit": limit}
    for name, value in (("from", _instant(start)), ("to", _instant(end)), ("action", action),
                        ("cursor", cursor)):
        if value is not None:
            params[name] = value
    return Call("GET", "/audit", params=params)


def events_headers(last_event_id: int | None) -> dict[str, str]:
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if last_event_id:
        headers["Last-Event-ID"] = str(last_event_id)
    return headers


def stream_timeout(timeout: float) -> httpx.Timeout:
    return httpx.Timeout(timeout, read=max(timeout, STREAM_READ_TIMEOUT_S))


def check(response: httpx.Response) -> httpx.Response:
    """The response when 2xx, else its typed error (raised); the body must have been read."""
    if response.is_success:
        return response
    raise error_from_response(response)


def parse(model: type[M], response: httpx.Response) -> M:
    """A 2xx answer as the service's model; anything else as a typed error."""
    content = check(response).content
    try:
        return model.model_validate_json(content)
    except ValueError as exc:  # pydantic's ValidationError: not what the service answers
        raise SwarmApiError(f"unexpected answer to {response.request.method} "
                            f"{response.request.url.path}: {exc}", code="invalid_response",
                            status_code=response.status_code) from exc


def is_event(sse: ServerSentEvent) -> bool:
    """Whether an SSE message is an event: a comment-only block (the service's keep-alive
    `: ping`) reaches the decoder as a message without data that repeats the last id."""
    return bool(sse.data)


def to_event(sse: ServerSentEvent) -> SwarmEvent:
    """An SSE message of the events route as the service's `SwarmEvent`."""
    try:
        data = json.loads(sse.data) if sse.data else {}
        return SwarmEvent(id=int(sse.id), event=sse.event, data=data)
    except ValueError as exc:
        raise SwarmApiError(f"unreadable event {sse.id!r}: {exc}", code="invalid_event") from exc


def unreachable(base_url: str, exc: BaseException) -> ConnectionFailed:
    return ConnectionFailed(f"cannot reach the Swarm API at {base_url}: "
                            f"{type(exc).__name__}: {exc}".rstrip(": "),
                            code="connection_error")
