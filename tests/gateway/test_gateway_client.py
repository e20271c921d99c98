"""GatewayClient against httpx.MockTransport (classification, retries, waits, hooks) and real
sockets (the aiohttp path: its pool, hostile answers, keep-alive)."""

from __future__ import annotations

import asyncio
import json
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
from app.gateway import wire
from app.gateway.answers import _loads
from app.gateway.chat import AttemptRecord, ChatRequest, Usage
from app.gateway.client import GatewayClient
from app.gateway.errors import GatewayRejected, GatewayUnavailable
from tests.gateway_support import (
    API_KEY,
    BASE_URL,
    REQUEST,
    Gateway,
    Reply,
    ScriptedServer,
    completion,
    ok_response,
    raw_answer,
)
from tests.helpers import until


async def test_ok_parses_content_finish_reason_and_usage(
    make_client: Callable[..., GatewayClient],
) -> None:
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 40},
    }
    gateway = Gateway(httpx.Response(200, json=completion("answer", "stop", usage)))
    request = ChatRequest(
        model="m",
        messages=[{"role": "user", "content": "q"}],
        max_tokens=32,
        temperature=0.2,
        response_format={"type": "json_object"},
    )

    result = await make_client(gateway).complete(request)

    assert (result.content, result.finish_reason) == ("answer", "stop")
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (100, 7)
    assert result.usage.cached_tokens == 40
    [attempt] = result.attempts
    assert (attempt.attempt, attempt.status_code, attempt.outcome) == (1, 200, "ok")
    assert attempt.usage == result.usage and attempt.error is None
    sent = gateway.requests[0]
    assert sent.method == "POST" and str(sent.url) == f"{BASE_URL}/chat/completions"
    assert sent.headers["content-type"] == "application/json"
    assert json.loads(sent.content) == {
        "model": "m",
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": 32,
        "temperature": 0.2,
        "response_format": {"type": "json_object"},
    }


async def test_unset_options_are_left_out_of_the_body(
    make_client: Callable[..., GatewayClient],
) -> None:
    gateway = Gateway(ok_response())
    await make_client(gateway, api_key="").complete(
        ChatRequest(model="m", messages=[], max_tokens=1)
    )
    sent = gateway.requests[0]
    assert json.loads(sent.content) == {"model": "m", "messages": [], "max_tokens": 1}
    assert "authorization" not in sent.headers and "idempotency-key" not in sent.headers


async def test_null_content_and_length_finish_are_a_success_without_retry(
    make_client: Callable[..., GatewayClient],
) -> None:
    gateway = Gateway(httpx.Response(200, json=completion(None, "length")))
    result = await make_client(gateway).complete(REQUEST)
    assert (result.content, result.finish_reason) == ("", "length")
    assert len(gateway.requests) == 1


async def _sleep_forever(request: httpx.Request) -> httpx.Response:
    await asyncio.sleep(30)
    raise AssertionError("the attempt should have timed out")


def truncated() -> httpx.Response:
    return httpx.Response(200, content=json.dumps(completion()).encode()[:40])


RETRYABLE: list[tuple[str, Callable[[], Reply], str, int | None]] = [
    ("429", lambda: httpx.Response(429, json={"error": {"message": "slow"}}), "rate_limited", 429),
    ("500", lambda: httpx.Response(500, json={"error": "boom"}), "server_error", 500),
    ("502-html", lambda: httpx.Response(502, html="<html>Bad</html>"), "server_error", 502),
    ("503", lambda: httpx.Response(503), "server_error", 503),
    ("504", lambda: httpx.Response(504, text="gateway timeout"), "server_error", 504),
    ("529", lambda: httpx.Response(529, json={"error": "overloaded"}), "server_error", 529),
    ("408", lambda: httpx.Response(408), "timeout", 408),
    ("409", lambda: httpx.Response(409, json={"error": "in flight"}), "client_error", 409),
    ("slow", lambda: _sleep_forever, "timeout", None),
    ("read-timeout", lambda: httpx.ReadTimeout("read"), "timeout", None),
    ("connect-error", lambda: httpx.ConnectError("refused"), "connection_error", None),
    ("not-json", lambda: httpx.Response(200, text="<html>ok?</html>"), "invalid_response", 200),
    ("truncated", truncated, "invalid_response", 200),
    ("wrong-shape", lambda: httpx.Response(200, json={"choices": []}), "invalid_response", 200),
    ("no-message", lambda: httpx.Response(200, json={"choices": [{}]}), "invalid_response", 200),
]


@pytest.mark.parametrize(
    ("first", "outcome", "status"),
    [case[1:] for case in RETRYABLE],
    ids=[case[0] for case in RETRYABLE],
)
async def test_retryable_failures_recover_on_a_later_attempt(
    make_client: Callable[..., GatewayClient],
    waits: list[float],
    first: Callable[[], Reply],
    outcome: str,
    status: int | None,
) -> None:
    gateway = Gateway(first(), first(), ok_response())
    result = await make_client(gateway).complete(REQUEST, timeout_s=0.05)
    assert result.content == "hi"
    assert [a.outcome for a in result.attempts] == [outcome, outcome, "ok"]
    assert [a.status_code for a in result.attempts] == [status, status, 200]
    assert [a.attempt for a in result.attempts] == [1, 2, 3]
    assert all(a.error for a in result.attempts[:2]) and len(waits) == 2


def _message(message: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, json={"choices": [{"message": message, "finish_reason": "stop"}],
                                     "usage": {"prompt_tokens": 1, "completion_tokens": 1}})


CALL = {"id": "c1", "type": "function", "function": {"name": "docs__lookup", "arguments": "{}"}}


@pytest.mark.parametrize(("message", "content", "calls"), [
    pytest.param({"role": "assistant", "content": [{"type": "text", "text": "an "},
                                                   {"type": "text", "text": "answer"}]},
                 "an answer", 0, id="text-parts"),
    pytest.param({"role": "assistant", "tool_calls": [CALL]}, "", 1, id="calls-without-content"),
    pytest.param({"role": "assistant", "content": None, "tool_calls": [CALL]}, "", 1,
                 id="calls-with-null-content"),
])
async def test_answer_shapes_gateways_send_are_read(
    make_client: Callable[..., GatewayClient], message: dict[str, Any], content: str,
    calls: int,
) -> None:
    result = await make_client(Gateway(_message(message))).complete(REQUEST)
    assert (result.content, len(result.tool_calls)) == (content, calls)
    assert [a.outcome for a in result.attempts] == ["ok"]


@pytest.mark.parametrize("message", [
    pytest.param({"role": "assistant"}, id="no-content-no-calls"),
    pytest.param({"role": "assistant", "content": [{"type": "image_url"}]}, id="not-text-parts"),
    pytest.param({"role": "assistant", "content": 5}, id="a-number"),
])
async def test_answers_without_text_or_calls_are_invalid(
    make_client: Callable[..., GatewayClient], waits: list[float], message: dict[str, Any],
) -> None:
    gateway = Gateway(_message(message), ok_response())
    result = await make_client(gateway).complete(REQUEST)
    assert [a.outcome for a in result.attempts] == ["invalid_response", "ok"]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 418])
async def test_non_retryable_statuses_are_rejected_after_one_attempt(
    make_client: Callable[..., GatewayClient], waits: list[float], status: int
) -> None:
    gateway = Gateway(httpx.Response(status, json={"error": {"message": "bad request"}}))
    with pytest.raises(GatewayRejected) as caught:
        await make_client(gateway).complete(REQUEST, max_attempts=5)
    assert len(gateway.requests) == 1 and waits == []
    assert (caught.value.status_code, caught.value.outcome) == (status, "client_error")
    assert [a.attempt for a in caught.value.attempts] == [1]
    assert f"HTTP {status}" in str(caught.value) and "bad request" in str(caught.value)


async def test_usage_reported_by_failed_attempts_is_kept(
    make_client: Callable[..., GatewayClient], waits: list[float]
) -> None:
    billed = {"prompt_tokens": 50, "completion_tokens": 9}
    gateway = Gateway(httpx.Response(500, json={"error": "late", "usage": billed}))
    with pytest.raises(GatewayUnavailable) as caught:
        await make_client(gateway).complete(REQUEST, max_attempts=2)
    assert [(a.usage.prompt_tokens, a.usage.completion_tokens) for a in caught.value.attempts] == [
        (50, 9),
        (50, 9),
    ]


UNUSABLE_USAGE = [
    pytest.param(None, id="absent"),
    pytest.param("12 tokens", id="not-an-object"),
    pytest.param({"total_tokens": 15}, id="no-counts"),
    pytest.param({"prompt_tokens": "12", "completion_tokens": 3}, id="string"),
    pytest.param({"prompt_tokens": 12, "completion_tokens": 3.0}, id="float"),
    pytest.param({"prompt_tokens": True, "completion_tokens": 3}, id="bool"),
    pytest.param({"prompt_tokens": 12, "completion_tokens": -3}, id="negative"),
    pytest.param({"prompt_tokens": 10**20, "completion_tokens": 3}, id="absurd"),
]


@pytest.mark.parametrize("usage", UNUSABLE_USAGE)
async def test_an_answer_without_usable_usage_is_billed_its_upper_bound(
    make_client: Callable[..., GatewayClient], usage: Any
) -> None:
    """The gateway produced the answer and bills it: a usage that cannot be read is not 0
    tokens (the budget would never see the call) but the bytes sent and received."""
    body = {**completion("answer"), "usage": usage}
    raw = json.dumps(body).encode()
    gateway = Gateway(httpx.Response(200, content=raw))
    result = await make_client(gateway).complete(REQUEST)
    assert result.content == "answer"
    [attempt] = result.attempts
    assert attempt.outcome == "ok" and not attempt.usage_reported
    assert attempt.usage.prompt_tokens == len(gateway.requests[0].content)
    assert attempt.usage.completion_tokens == len(raw) and attempt.usage.cached_tokens == 0


async def test_a_truncated_2xx_and_a_failure_are_billed_what_they_report(
    make_client: Callable[..., GatewayClient], waits: list[float]
) -> None:
    cut = json.dumps(completion("answer")).encode()[:-20]
    gateway = Gateway(httpx.Response(200, content=cut), httpx.Response(503, content=b"busy"),
                      ok_response())
    result = await make_client(gateway).complete(REQUEST, max_attempts=3)
    truncated, failed, ok = result.attempts
    assert truncated.outcome == "invalid_response" and truncated.usage == Usage()
    assert failed.outcome == "server_error" and failed.usage == Usage()
    assert ok.usage_reported and (ok.usage.prompt_tokens, ok.usage.completion_tokens) == (12, 3)


async def test_an_unreadable_cached_count_bills_the_full_prompt(
    make_client: Callable[..., GatewayClient],
) -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 7,
             "prompt_tokens_details": {"cached_tokens": "40"}}
    gateway = Gateway(httpx.Response(200, json=completion("answer", "stop", usage)))
    result = await make_client(gateway).complete(REQUEST)
    assert result.usage == Usage(100, 7, 0) and result.attempts[0].usage_reported


def test_usage_within_bounds() -> None:
    usage = Usage(500, 90, 450)
    assert usage.within(1000, 100) is usage
    assert usage.within(200, 50) == Usage(200, 50, 200)
    assert usage.within(200, 100) == Usage(200, 90, 200)


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
    gateway = Gateway(_sleep_forever)
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


OK_BODY = json.dumps(completion()).encode()


async def test_network_calls_share_one_pool_of_at_most_max_inflight_connections() -> None:
    server = ScriptedServer(raw_answer("200 OK", OK_BODY, "Content-Type: application/json",
                                       keep_alive=True))
    async with server as url:
        client = GatewayClient(url, max_inflight=4)
        try:
            server.release.clear()
            calls = [asyncio.create_task(client.complete(REQUEST)) for _ in range(12)]
            await until(lambda: server.held == 4, 10, "4 requests held", every=0.01)
            await asyncio.sleep(0.05)  # the other 8 wait for a connection, not a new one
            assert (server.held, server.connections) == (4, 4)
            server.release.set()
            results = await asyncio.gather(*calls)
        finally:
            await client.aclose()
    assert all(r.content == "hi" and len(r.attempts) == 1 for r in results)
    assert (server.requests, server.connections, server.most_held) == (12, 4, 4)


def _gzipped(body: bytes) -> bytes:
    import gzip
    return gzip.compress(body)


# What a hostile or broken gateway can answer on a real socket, and how each attempt is
# classified (the aiohttp path: the mock-transport cases above go through httpx).
NETWORK_ANSWERS = [
    ("ok-gzip", raw_answer("200 OK", _gzipped(OK_BODY), "Content-Encoding: gzip"),
     "ok", 200, None),
    ("bad-gzip", raw_answer("200 OK", b"not gzip", "Content-Encoding: gzip"),
     "invalid_response", None, "undecodable body"),
    ("not-http", b"\x00\x01garbage\r\n\r\n", "connection_error", None, "Bad status line"),
    ("bad-status", b"HTTP/1.1 abc OK\r\n\r\n", "connection_error", None, "status"),
    ("truncated", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\":",
     "connection_error", None, "payload"),
    ("closed-unanswered", b"", "connection_error", None, "disconnected"),
    ("huge-header", raw_answer("200 OK", OK_BODY, "X-Pad: " + "a" * 20_000),
     "connection_error", None, "8190"),
    ("bad-chunks", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
     "connection_error", None, "chunk"),
    ("latin-1-reason", raw_answer("503 \u00dcberlastet", b"{}"), "server_error", 503, "HTTP 503"),
    ("silent", None, "timeout", None, "no response within"),
]


@pytest.mark.parametrize(("answer", "outcome", "status", "error"),
                         [case[1:] for case in NETWORK_ANSWERS],
                         ids=[case[0] for case in NETWORK_ANSWERS])
async def test_hostile_answers_on_the_network_are_classified(
        answer: bytes | None, outcome: str, status: int | None, error: str | None,
        waits: list[float]) -> None:
    good = raw_answer("200 OK", OK_BODY)
    server = ScriptedServer(answer, good, close=True)
    async with server as url:
        client = GatewayClient(url, API_KEY)
        try:
            result = await client.complete(REQUEST, timeout_s=0.3)
        finally:
            await client.aclose()
    first = result.attempts[0]
    assert (first.outcome, first.status_code) == (outcome, status)
    assert error is None or error.lower() in (first.error or "").lower()
    assert API_KEY not in (first.error or "") and result.content == "hi"
    assert len(result.attempts) == (1 if outcome == "ok" else 2)


@pytest.mark.parametrize("status", ["307 Temporary Redirect", "308 Permanent Redirect",
                                    "302 Found"])
async def test_a_redirect_is_an_answer_not_an_address_to_follow(status: str) -> None:
    """A gateway naming another URL (its own, or an internal one) is refused as it is: the
    caller's body and our key are not sent again anywhere."""
    server = ScriptedServer(raw_answer(status, b"", "Location: /stolen"),
                            raw_answer("200 OK", OK_BODY), close=True)
    async with server as url:
        client = GatewayClient(url, API_KEY)
        try:
            with pytest.raises(GatewayRejected) as caught:
                await client.complete(REQUEST, timeout_s=2)
        finally:
            await client.aclose()
    assert server.requests == 1
    [attempt] = caught.value.attempts
    assert (attempt.outcome, attempt.status_code) == ("client_error", int(status[:3]))


def _chunked(body: bytes) -> bytes:
    pieces = [body[i:i + 700] for i in range(0, len(body), 700)]
    return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n")


BIG = json.dumps(completion("x" * 5000)).encode()


@pytest.mark.parametrize("answer", [
    pytest.param(raw_answer("200 OK", BIG), id="declared-length"),
    pytest.param(_chunked(BIG), id="chunked"),
    pytest.param(raw_answer("200 OK", _gzipped(BIG), "Content-Encoding: gzip"), id="gzip-bomb"),
])
async def test_an_answer_past_the_size_cap_is_refused(
        answer: bytes, waits: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    """An endless (or decompression-bomb) answer would take the process's memory: it is read
    up to the call's bound, then an invalid_response, retried."""
    monkeypatch.setattr(wire, "ANSWER_FLOOR_BYTES", 4000)  # REQUEST's 64 tokens: 4,096 bytes
    monkeypatch.setattr(wire, "BYTES_PER_TOKEN", 1)
    server = ScriptedServer(answer, raw_answer("200 OK", OK_BODY), close=True)
    async with server as url:
        client = GatewayClient(url, API_KEY)
        try:
            result = await client.complete(REQUEST, timeout_s=2)
        finally:
            await client.aclose()
    first, ok = result.attempts
    assert (first.outcome, ok.outcome) == ("invalid_response", "ok") and result.content == "hi"
    assert "answer over" in (first.error or "") and first.usage == Usage()


async def test_a_connection_that_never_opens_is_a_timeout(waits: list[float]) -> None:
    """A gateway whose accept queue is full never completes the handshake: the connect timer
    runs out, and the attempt is a `timeout` (retried), not a broken connection."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = []
    try:
        for _ in range(3):  # fill the accept queue: later handshakes get no answer
            extra = socket.socket()
            extra.setblocking(False)
            extra.connect_ex(("127.0.0.1", port))
            queued.append(extra)
        await asyncio.sleep(0.1)
        client = GatewayClient(f"http://127.0.0.1:{port}/v1", connect_timeout_s=0.2)
        try:
            with pytest.raises(GatewayUnavailable) as caught:
                await client.complete(REQUEST, max_attempts=2, timeout_s=5)
        finally:
            await client.aclose()
    finally:
        for sock in (*queued, listener):
            sock.close()
    assert [a.outcome for a in caught.value.attempts] == ["timeout", "timeout"]
    assert all(a.latency_s < 2 for a in caught.value.attempts)  # the connect timer, not 5 s
    # the stored error names the timer that ran out, not the attempt's 5 s
    assert all(a.error == "no connection within 0.2 s" for a in caught.value.attempts)


async def test_wait_hints_arrive_over_the_network_in_any_case() -> None:
    server = ScriptedServer(raw_answer("429 Too Many Requests", b"{}", "RETRY-AFTER-MS: 150"),
                            raw_answer("200 OK", OK_BODY))
    async with server as url:
        client = GatewayClient(url)
        try:
            started = time.monotonic()
            result = await client.complete(REQUEST)
        finally:
            await client.aclose()
    assert [a.outcome for a in result.attempts] == ["rate_limited", "ok"]
    assert result.attempts[0].retry_after_s == 0.15 and time.monotonic() - started >= 0.15


class ClosingServer(ScriptedServer):
    """A real HTTP/1.1 server that, like uvicorn past its keep-alive timeout, has given up on
    a connection idle for `idle_s`: a request arriving on it is dropped unanswered."""

    def __init__(self, idle_s: float) -> None:
        super().__init__()
        self.idle_s = idle_s
        self.answered = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        body = json.dumps(completion()).encode()
        idle_since = time.monotonic()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if time.monotonic() - idle_since > self.idle_s:
                    return  # closed unanswered: the client sees a ReadError
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                self.answered += 1
                idle_since = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize(("keepalive_s", "attempts", "connections"),
                         [(0.2, 1, 2), (5.0, 2, 2)])
async def test_idle_connections_are_closed_before_the_server_closes_them(
        keepalive_s: float, attempts: int, connections: int, waits: list[float]) -> None:
    """A connection idle past the server's keep-alive timeout is one the server is closing: a
    request sent on it fails unread and costs an attempt. Closed by the client first (its
    keep-alive below the server's), the call goes out on a fresh connection at once."""
    server = ClosingServer(idle_s=0.5)
    async with server as url:
        client = GatewayClient(url, keepalive_s=keepalive_s)
        try:
            await client.complete(REQUEST)
            await asyncio.sleep(0.7)
            result = await client.complete(REQUEST)
        finally:
            await client.aclose()
    assert [a.outcome for a in result.attempts] == ["connection_error", "ok"][-attempts:]
    assert (server.connections, server.answered) == (connections, 2)


@pytest.mark.parametrize("raw", [
    b'{"a": 1, "a": 2}', b"[NaN, Infinity, -Infinity]", b"1e400", b"123456789012345678901234567890",
    b'"\\ud800"',  # a lone surrogate escape: pydantic-core refuses it, json reads it
    b"\xef\xbb\xbf{}",  # a BOM
    '{"a": "\u00e9"}'.encode("utf-16"),  # json detects UTF-16
    b"[1,]", b"01", b"1" * 5000, b"[" * 3000 + b"]" * 3000, b"\xff", b"",
])
def test_an_answer_reads_as_the_standard_library_reads_it(raw: bytes) -> None:
    try:
        expected = json.loads(raw)
    except (ValueError, RecursionError):
        expected = None
    assert repr(_loads(raw)) == repr(expected)
