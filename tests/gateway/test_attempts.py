"""A call's attempts (app/gateway/attempts.py) through GatewayClient on httpx.MockTransport:
wait hints and backoff, deadlines, hooks around each attempt, headers on retries, cancellation."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from app.aio import wait_for
from app.gateway import client as client_module
from app.gateway.chat import AttemptRecord
from app.gateway.client import GatewayClient
from app.gateway.errors import GatewayRejected, GatewayUnavailable
from tests.gateway_support import (
    API_KEY,
    REQUEST,
    Gateway,
    ok_response,
    sleep_forever,
)


def _date_in(seconds: float) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=seconds), usegmt=True)


@pytest.mark.parametrize(
    ("headers", "low", "high"),
    [
        (lambda: {"retry-after-ms": "200"}, 0.2, 0.2),
        (lambda: {"Retry-After": "0.2"}, 0.2, 0.2),
        # An HTTP date has whole seconds: 1.2 s ahead, truncated, is 0.2-1.2 s ahead.
        (lambda: {"Retry-After": _date_in(1.2)}, 0.15, 1.25),
        # retry-after-ms is the finer hint and wins over Retry-After.
        (lambda: {"retry-after-ms": "200", "Retry-After": "30"}, 0.2, 0.2),
        # LiteLLM renames the provider's hints with its `llm_provider-` prefix (SPEC §4).
        (lambda: {"llm_provider-retry-after-ms": "300"}, 0.3, 0.3),
        (lambda: {"llm_provider-retry-after": "0.3"}, 0.3, 0.3),
        (lambda: {"llm_provider-retry-after": "9", "Retry-After": "0.2"}, 0.2, 0.2),
    ],
    ids=["retry-after-ms", "seconds", "http-date", "ms-wins", "litellm-ms", "litellm-seconds",
         "plain-wins"],
)
async def test_server_wait_hints_are_honoured(
    make_client: Callable[..., GatewayClient],
    headers: Callable[[], dict[str, str]],
    low: float,
    high: float,
) -> None:
    async def limited(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers=headers())

    gateway = Gateway(limited, ok_response())
    result = await make_client(gateway).complete(REQUEST)
    hint = result.attempts[0].retry_after_s
    assert hint is not None and low <= hint <= high
    assert gateway.times[1] - gateway.times[0] >= hint


@pytest.mark.parametrize(
    "headers",
    [{"retry-after-ms": "3600000"}, {"Retry-After": "3600"}, {"Retry-After": _date_in(7200)}],
    ids=["ms", "seconds", "http-date"],
)
async def test_waits_are_capped_at_sixty_seconds(
    make_client: Callable[..., GatewayClient], waits: list[float], headers: dict[str, str]
) -> None:
    gateway = Gateway(httpx.Response(503, headers=headers), ok_response())
    result = await make_client(gateway).complete(REQUEST)
    assert waits == [60.0]
    assert (result.attempts[0].retry_after_s or 0) > 3000  # the record keeps the raw hint


async def test_without_a_hint_backoff_doubles_with_full_jitter(
    make_client: Callable[..., GatewayClient],
    waits: list[float],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranges: list[tuple[float, float]] = []

    def top(low: float, high: float) -> float:
        ranges.append((low, high))
        return high

    monkeypatch.setattr(random, "uniform", top)
    gateway = Gateway(httpx.Response(500))
    with pytest.raises(GatewayUnavailable):
        await make_client(gateway).complete(REQUEST, max_attempts=4)
    assert ranges == [(0.0, 0.5), (0.0, 1.0), (0.0, 2.0)] and waits == [0.5, 1.0, 2.0]


async def test_exhausted_attempts_raise_unavailable_with_every_attempt(
    make_client: Callable[..., GatewayClient], waits: list[float]
) -> None:
    gateway = Gateway(httpx.Response(503, text="down"))
    with pytest.raises(GatewayUnavailable) as caught:
        await make_client(gateway).complete(REQUEST, max_attempts=3)
    error = caught.value
    assert len(gateway.requests) == 3 and not error.deadline_hit
    assert [a.attempt for a in error.attempts] == [1, 2, 3]
    assert (error.status_code, error.outcome) == (503, "server_error")
    assert "3 attempts" in str(error) and "HTTP 503" in str(error)


async def test_a_wait_past_the_deadline_stops_retrying_at_once(
    make_client: Callable[..., GatewayClient],
) -> None:
    gateway = Gateway(httpx.Response(429, headers={"Retry-After": "5"}), ok_response())
    started = time.monotonic()
    with pytest.raises(GatewayUnavailable) as caught:
        await make_client(gateway).complete(REQUEST, max_attempts=5, deadline=started + 1.0)
    assert caught.value.deadline_hit and len(caught.value.attempts) == 1
    assert time.monotonic() - started < 0.5 and len(gateway.requests) == 1


@pytest.mark.parametrize("max_attempts", [1, 3])
async def test_the_deadline_clamps_the_attempt_timeout(
    make_client: Callable[..., GatewayClient], max_attempts: int
) -> None:
    gateway = Gateway(sleep_forever)
    started = time.monotonic()
    with pytest.raises(GatewayUnavailable) as caught:
        await make_client(gateway).complete(
            REQUEST, max_attempts=max_attempts, timeout_s=10, deadline=started + 0.2
        )
    assert caught.value.deadline_hit and [a.outcome for a in caught.value.attempts] == ["timeout"]
    assert 0.15 < time.monotonic() - started < 1.0


async def test_a_deadline_already_past_sends_nothing(
    make_client: Callable[..., GatewayClient],
) -> None:
    gateway = Gateway(ok_response())
    called: list[int] = []

    async def before(attempt: int) -> None:
        called.append(attempt)

    with pytest.raises(GatewayUnavailable) as caught:
        await make_client(gateway).complete(
            REQUEST, deadline=time.monotonic() - 1, before_attempt=before
        )
    assert caught.value.deadline_hit and caught.value.attempts == ()
    assert gateway.requests == [] and called == []


async def test_a_deadline_passed_inside_before_attempt_sends_nothing_but_is_recorded(
    make_client: Callable[..., GatewayClient],
) -> None:
    gateway = Gateway(ok_response())
    seen: list[AttemptRecord] = []

    async def slow_reservation(attempt: int) -> None:
        await asyncio.sleep(0.1)

    async def after(record: AttemptRecord) -> None:
        seen.append(record)

    with pytest.raises(GatewayUnavailable) as caught:
        await make_client(gateway).complete(
            REQUEST,
            deadline=time.monotonic() + 0.05,
            before_attempt=slow_reservation,
            after_attempt=after,
        )
    assert caught.value.deadline_hit and gateway.requests == []
    assert [(r.outcome, r.status_code) for r in seen] == [("timeout", None)]


async def test_hooks_run_in_order_around_each_attempt(
    make_client: Callable[..., GatewayClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[Any] = []

    async def before(attempt: int) -> None:
        events.append(("before", attempt))

    async def after(record: AttemptRecord) -> None:
        events.append(("after", record))

    async def sleep(seconds: float) -> None:
        events.append(("sleep", seconds))

    monkeypatch.setattr(client_module, "_sleep", sleep)
    gateway = Gateway(httpx.Response(503, headers={"retry-after-ms": "5"}), ok_response())
    result = await make_client(gateway).complete(
        REQUEST, before_attempt=before, after_attempt=after
    )
    assert events == [
        ("before", 1),
        ("after", result.attempts[0]),
        ("sleep", 0.005),
        ("before", 2),
        ("after", result.attempts[1]),
    ]
    assert [a.outcome for a in result.attempts] == ["server_error", "ok"]


class Refused(Exception):
    pass


@pytest.mark.parametrize("refuse_at", [1, 2])
async def test_an_error_from_before_attempt_propagates_and_sends_nothing(
    make_client: Callable[..., GatewayClient], waits: list[float], refuse_at: int
) -> None:
    async def before(attempt: int) -> None:
        if attempt == refuse_at:
            raise Refused

    gateway = Gateway(httpx.Response(500), ok_response())
    with pytest.raises(Refused):
        await make_client(gateway).complete(REQUEST, before_attempt=before)
    assert len(gateway.requests) == refuse_at - 1


async def test_headers_repeat_on_every_retry_and_the_key_never_leaks(
    make_client: Callable[..., GatewayClient], waits: list[float]
) -> None:
    async def echo(request: httpx.Request) -> httpx.Response:
        seen = request.headers.get("authorization")
        return httpx.Response(500, json={"error": {"message": f"bad auth {seen}"}})

    gateway = Gateway(echo, httpx.ConnectError(f"refused {API_KEY}"), echo)
    with pytest.raises(GatewayUnavailable) as caught:
        await make_client(gateway).complete(REQUEST, max_attempts=3)
    assert [r.headers["idempotency-key"] for r in gateway.requests] == ["swarm-1:task-a:1"] * 3
    assert [r.headers["authorization"] for r in gateway.requests] == [f"Bearer {API_KEY}"] * 3
    messages = [str(caught.value)] + [a.error or "" for a in caught.value.attempts]
    assert all("bad auth" in m or "refused" in m for m in messages)
    assert not any(API_KEY in m for m in messages)

    gateway = Gateway(echo)
    gateway.replies = [httpx.Response(401, text=f"key {API_KEY} is not valid")]
    with pytest.raises(GatewayRejected) as rejected:
        await make_client(gateway).complete(REQUEST)
    assert "is not valid" in str(rejected.value) and API_KEY not in str(rejected.value)


async def test_cancelling_a_call_abandons_the_request_promptly(
    make_client: Callable[..., GatewayClient],
) -> None:
    arrived = asyncio.Event()
    after_calls: list[AttemptRecord] = []

    async def hang(request: httpx.Request) -> httpx.Response:
        arrived.set()
        await asyncio.sleep(30)
        return ok_response()

    async def after(record: AttemptRecord) -> None:
        after_calls.append(record)

    client = make_client(Gateway(hang))
    task = asyncio.create_task(client.complete(REQUEST, after_attempt=after))
    await wait_for(arrived.wait(), 1)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await wait_for(task, 1)
    assert time.monotonic() - started < 0.5
    assert after_calls == []
