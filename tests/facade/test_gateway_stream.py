"""GatewayClient.stream: retried like a plain call until the first event arrives, relayed as it
comes after that; every attempt recorded once, with the stream's usage (or an upper bound)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from app.gateway import client as gateway_client
from app.gateway import eventstream, streaming
from app.gateway.chat import AttemptRecord
from app.gateway.client import GatewayClient
from app.gateway.errors import GatewayRejected, GatewayUnavailable

BODY = json.dumps({"model": "m", "stream": True,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
SSE = {"content-type": "text/event-stream"}
USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def event(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    return event({"object": "chat.completion.chunk",
                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


async def body_of(parts: list[bytes], *, fail_after: int | None = None,
                  hang_s: float = 0.0) -> AsyncIterator[bytes]:
    if hang_s:
        await asyncio.sleep(hang_s)
    for i, part in enumerate(parts):
        if fail_after is not None and i == fail_after:
            raise httpx.ReadError("connection reset")
        yield part


GOOD = [chunk("Hel"), chunk("lo"), chunk(None, "stop"),
        event({"object": "chat.completion.chunk", "choices": [], "usage": USAGE}),
        event(b"[DONE]")]


class Gateway:
    """A GatewayClient over a MockTransport answering one planned response per attempt."""

    def __init__(self, answers: list[Callable[[], httpx.Response]]) -> None:
        self.answers = answers
        self.sent: list[httpx.Request] = []
        self.responses: list[httpx.Response] = []
        self.records: list[AttemptRecord] = []
        self.client = GatewayClient("http://gw/v1", transport=httpx.MockTransport(self.handle))

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        self.responses.append(self.answers[min(len(self.sent), len(self.answers)) - 1]())
        return self.responses[-1]

    def all_closed(self) -> bool:
        """Every answer's connection given back (the pool would leak a connection per stream)."""
        return all(response.is_closed for response in self.responses)

    async def after(self, rec: AttemptRecord) -> None:
        self.records.append(rec)

    def stream(self, **kw: Any) -> Any:
        return streaming.stream(self.client, BODY, idempotency_key="k",
                                after_attempt=self.after, **kw)


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    async def instant(_: float) -> None:
        return None
    monkeypatch.setattr(gateway_client, "_sleep", instant)


def ok(parts: list[bytes] = GOOD, **kw: Any) -> Callable[[], httpx.Response]:
    return lambda: httpx.Response(200, headers=SSE, content=body_of(parts, **kw))


async def test_retried_until_the_first_event_then_relayed() -> None:
    gw = Gateway([lambda: httpx.Response(503, json={"error": {"message": "busy"}}), ok()])
    async with gw.stream() as stream:
        data = [d async for d in stream]
    assert data[-1] == "[DONE]" and len(data) == 5
    assert [r.outcome for r in gw.records] == ["server_error", "ok"]
    assert gw.records[-1].usage.prompt_tokens == 11
    assert gw.records[-1].usage.completion_tokens == 7 and gw.records[-1].usage_reported
    assert stream.finish_reason == "stop"
    assert {r.headers["idempotency-key"] for r in gw.sent} == {"k"}  # one logical call
    assert gw.all_closed()


async def test_rejected_and_exhausted_attempts_raise_before_streaming() -> None:
    gw = Gateway([lambda: httpx.Response(400, json={"error": {"message": "bad"}})])
    with pytest.raises(GatewayRejected):
        async with gw.stream():
            pass
    assert len(gw.sent) == 1
    gw = Gateway([lambda: httpx.Response(429, headers={"retry-after-ms": "1"})])
    with pytest.raises(GatewayUnavailable) as caught:
        async with gw.stream(max_attempts=3):
            pass
    assert caught.value.outcome == "rate_limited" and len(gw.records) == 3
    assert caught.value.attempts[-1].retry_after_s == 0.001
    assert gw.all_closed()


async def test_no_first_event_in_time_or_not_a_stream_is_retried() -> None:
    gw = Gateway([ok(hang_s=5), lambda: httpx.Response(200, json={"choices": []}), ok()])
    async with gw.stream(timeout_s=0.2) as stream:
        assert [d async for d in stream][-1] == "[DONE]"
    assert [r.outcome for r in gw.records] == ["timeout", "invalid_response", "ok"]
    assert gw.all_closed()


async def test_a_stream_without_usage_is_billed_on_an_upper_bound() -> None:
    gw = Gateway([ok([chunk("Hello"), chunk("é", "stop"), event(b"[DONE]")])])
    async with gw.stream() as stream:
        assert len([d async for d in stream]) == 3
    rec = gw.records[-1]
    assert rec.outcome == "ok" and not rec.usage_reported
    # every request byte may be a prompt token; every streamed content byte a completion one
    assert (rec.usage.prompt_tokens, rec.usage.completion_tokens) == (len(BODY), 5 + 2)


async def test_an_unreported_streams_bound_counts_every_text_it_carried() -> None:
    """Tool calls' names and arguments and reasoning are generated tokens too."""
    call = {"index": 0, "id": "c1", "function": {"name": "lookup", "arguments": '{"q":"é"}'}}
    delta = {"reasoning_content": "think", "tool_calls": [call]}
    gw = Gateway([ok([event({"choices": [{"index": 0, "delta": delta}]}), event(b"[DONE]")])])
    async with gw.stream() as stream:
        assert len([d async for d in stream]) == 2
    rec = gw.records[-1]
    assert not rec.usage_reported
    assert rec.usage.completion_tokens >= len("think") + len("lookup") + len('{"q":"é"}'.encode())


async def test_a_stream_closed_before_done_raises_and_is_billed() -> None:
    gw = Gateway([ok([chunk("Hel"), chunk("lo")])])
    seen: list[str] = []
    with pytest.raises(GatewayUnavailable, match=r"before \[DONE\]"):
        async with gw.stream() as stream:
            async for data in stream:
                seen.append(data)
    assert len(seen) == 2
    [rec] = gw.records
    assert rec.outcome == "invalid_response" and rec.usage.completion_tokens == 5


async def test_a_line_past_the_cap_fails_the_attempt_or_the_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An endless line would be held whole by the SSE decoder: past the cap it is refused —
    before the first event a failed attempt (retried), after it a broken stream."""
    monkeypatch.setattr(eventstream, "MAX_EVENT_CHARS", 200)
    long = chunk("x" * 300)
    pieces = [long[i:i + 50] for i in range(0, len(long), 50)]  # as a network delivers it
    gw = Gateway([ok(pieces), ok()])
    async with gw.stream() as stream:
        assert [d async for d in stream][-1] == "[DONE]"
    assert [r.outcome for r in gw.records] == ["invalid_response", "ok"]
    gw = Gateway([ok([chunk("Hel"), *pieces, event(b"[DONE]")])])
    with pytest.raises(GatewayUnavailable, match="over 200 characters"):
        async with gw.stream() as stream:
            async for _ in stream:
                pass
    assert [r.outcome for r in gw.records] == ["connection_error"]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
async def test_an_event_of_endless_lines_is_capped_whole_events_are_not(
        monkeypatch: pytest.MonkeyPatch, newline: str) -> None:
    """The decoder holds every `data:` line of an event until its blank line: an event of
    short lines past the cap is refused as one long line is; a stream of many events, each
    under it, is read however long it is and wherever the network splits its blank lines."""
    monkeypatch.setattr(eventstream, "MAX_EVENT_CHARS", 200)

    def split(raw: str) -> list[bytes]:
        data = raw.replace("\n", newline).encode()
        return [data[i:i + 7] for i in range(0, len(data), 7)]  # breaks land inside pairs

    endless = "".join(f"data: {i:04}\n" for i in range(40))  # 440 characters, no blank line
    gw = Gateway([ok([*split(chunk("Hel").decode()), *split(endless)])])
    with pytest.raises(GatewayUnavailable, match="event over 200 characters"):
        async with gw.stream() as stream:
            async for _ in stream:
                pass
    many = "".join(chunk(f"{i:03}").decode() for i in range(30))  # ~100 characters each
    gw = Gateway([ok(split(many + event(b"[DONE]").decode()))])
    async with gw.stream() as stream:
        got = [d async for d in stream]
    assert len(got) == 31 and got[-1] == "[DONE]"


async def test_a_stream_is_bounded_whole_not_only_between_events() -> None:
    """A gateway that never stops sending (each event well within the idle timeout) would
    hold the call's row and reservation for ever: past `max_s` the stream ends, a timeout
    billed for what it carried; one that ends in time is read whole."""
    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield chunk("x")
            await asyncio.sleep(0.02)

    gw = Gateway([lambda: httpx.Response(200, headers=SSE, content=endless())])
    seen = 0
    with pytest.raises(GatewayUnavailable, match=r"stream longer than 0\.3 s"):
        async with gw.stream(timeout_s=5, max_s=0.3) as stream:
            async for _ in stream:
                seen += 1
    assert seen > 3 and [r.outcome for r in gw.records] == ["timeout"]
    assert gw.records[0].usage.completion_tokens == seen  # a byte a token, upper bound
    assert gw.all_closed()
    gw = Gateway([ok()])
    async with gw.stream(timeout_s=5, max_s=30) as stream:
        assert [d async for d in stream][-1] == "[DONE]"


async def test_a_stream_that_breaks_midway_raises_and_is_recorded_once() -> None:
    gw = Gateway([ok(fail_after=2)])
    seen: list[str] = []
    with pytest.raises(GatewayUnavailable):
        async with gw.stream() as stream:
            async for data in stream:
                seen.append(data)
    assert len(seen) == 2  # what arrived was relayed; no retry once it had
    assert len(gw.sent) == 1 and [r.outcome for r in gw.records] == ["connection_error"]
    assert gw.records[0].usage.completion_tokens == 5  # "Hel" + "lo", as a bound
    assert gw.all_closed()


async def test_a_reader_that_leaves_early_is_billed_for_what_it_saw() -> None:
    gw = Gateway([ok()])
    async with gw.stream() as stream:
        async for _ in stream:
            break
    (rec,) = gw.records
    assert rec.outcome == "ok" and rec.error == "stream abandoned by the reader"
    assert gw.all_closed()
