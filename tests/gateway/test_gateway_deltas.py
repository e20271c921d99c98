"""A worker's call streamed (ChatRequest.on_delta, app/gateway/deltas.py): the text handed on
as it comes, the answer the same as a buffered call's (content, tool calls, usage), a gateway
that does not stream asked plainly, a broken stream retried like a broken body."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import httpx

from app.gateway.client import GatewayClient
from tests.gateway_support import (
    API_KEY,
    REQUEST,
    Gateway,
    completion,
)


def sse(*chunks: dict[str, Any] | str) -> httpx.Response:
    body = "".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks)
    return httpx.Response(200, content=body.encode(),
                          headers={"content-type": "text/event-stream"})


def piece(content: str | None = None, finish: str | None = None, **delta: Any
          ) -> dict[str, Any]:
    if content is not None:
        delta["content"] = content
    return {"id": "c1", "model": "kimi-k2.5", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


USAGE = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}


def streamed(seen: list[str]) -> Any:
    return dataclasses.replace(REQUEST, on_delta=seen.append)


async def test_text_is_handed_on_as_it_comes_and_the_answer_is_whole(
        make_client: Callable[..., GatewayClient]) -> None:
    gateway = Gateway(sse(piece("", role="assistant"), piece("Hel"), piece("lo"),
                          piece(finish="stop"), USAGE, "[DONE]"))
    seen: list[str] = []
    result = await make_client(gateway).complete(streamed(seen))
    assert seen == ["Hel", "lo"]
    assert (result.content, result.finish_reason) == ("Hello", "stop")
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (9, 4)
    assert len(result.attempts) == 1 and result.attempts[0].usage_reported
    sent = json.loads(gateway.requests[0].content)
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert gateway.requests[0].headers["idempotency-key"] == REQUEST.idempotency_key


async def test_tool_calls_are_put_together_from_their_pieces(
        make_client: Callable[..., GatewayClient]) -> None:
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "time.now", "arguments": '{"tz":'}}
    more = {"index": 0, "function": {"arguments": ' "UTC"}'}}
    gateway = Gateway(sse(piece(tool_calls=[call]), piece(tool_calls=[more]),
                          piece(finish="tool_calls"), USAGE, "[DONE]"))
    result = await make_client(gateway).complete(streamed([]))
    (asked,) = result.tool_calls
    assert (asked.id, asked.name, asked.arguments) == ("call_1", "time.now", '{"tz": "UTC"}')
    assert result.finish_reason == "tool_calls"


async def test_a_gateway_that_refuses_to_stream_is_asked_plainly_in_the_same_attempt(
        make_client: Callable[..., GatewayClient]) -> None:
    gateway = Gateway(httpx.Response(400, json={"error": {"message": "stream unsupported"}}),
                      httpx.Response(200, json=completion("plain")))
    seen: list[str] = []
    result = await make_client(gateway).complete(streamed(seen))
    assert result.content == "plain" and seen == []
    assert len(result.attempts) == 1  # one attempt: one ledger row
    assert "stream" not in json.loads(gateway.requests[1].content)


async def test_a_plain_body_answering_a_streamed_request_is_read_as_it_is(
        make_client: Callable[..., GatewayClient]) -> None:
    gateway = Gateway(httpx.Response(200, json=completion("whole")))
    result = await make_client(gateway).complete(streamed([]))
    assert result.content == "whole" and len(gateway.requests) == 1


async def test_a_stream_broken_before_its_finish_is_retried(
        make_client: Callable[..., GatewayClient], waits: list[float]) -> None:
    gateway = Gateway(sse(piece("Hel")),  # no finish, no [DONE]
                      sse(piece("Hello"), piece(finish="stop"), USAGE, "[DONE]"))
    seen: list[str] = []
    result = await make_client(gateway).complete(streamed(seen))
    assert result.content == "Hello"
    assert [a.outcome for a in result.attempts] == ["invalid_response", "ok"]
    assert seen == ["Hel", "Hello"]  # a retried attempt streams again from its start


async def test_the_gateways_key_echoed_in_a_piece_is_masked(
        make_client: Callable[..., GatewayClient]) -> None:
    gateway = Gateway(sse(piece(f"key {API_KEY}!"), piece(finish="stop"), USAGE, "[DONE]"))
    seen: list[str] = []
    result = await make_client(gateway).complete(streamed(seen))
    assert API_KEY not in "".join(seen) and API_KEY not in result.content
    assert seen[0].startswith("key ") and seen[0].endswith("!")
