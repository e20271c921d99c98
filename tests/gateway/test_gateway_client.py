"""GatewayClient against httpx.MockTransport: how it classifies answers (retryable,
rejected, invalid) and bills what they report."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from app.gateway.chat import ChatRequest, Usage
from app.gateway.client import GatewayClient
from app.gateway.errors import GatewayRejected, GatewayUnavailable
from tests.gateway_support import (
    BASE_URL,
    REQUEST,
    Gateway,
    Reply,
    completion,
    ok_response,
    sleep_forever,
)


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
    ("slow", lambda: sleep_forever, "timeout", None),
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
