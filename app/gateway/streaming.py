"""Streamed chat completions: retried until the first event arrives, then relayed as they come.

Before the first event nothing has reached the caller, so a failed attempt is retried exactly
like a plain call (SPEC §4); after it, a failure ends the stream (raised to the reader). The
attempt is recorded once, when the stream closes, with the usage the stream reported.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import httpx
from httpx_sse import EventSource, ServerSentEvent, SSEError

from app.gateway.answers import _loads, _usage_of
from app.gateway.attempts import _Call
from app.gateway.chat import AfterAttempt, AttemptRecord, BeforeAttempt, ChatResult, Outcome, Usage
from app.gateway.client import GatewayClient
from app.gateway.errors import GatewayUnavailable
from app.gateway.eventstream import DONE, capped
from app.gateway.wire import limit_of

_ERROR_BODY_BYTES = 64 * 1024  # what is read of a failed attempt's body


@dataclass
class _Opened:
    """An attempt whose first event arrived: the response is open, the rest is unread."""

    number: int
    response: httpx.Response
    events: AsyncIterator[ServerSentEvent]
    first: ServerSentEvent
    started: float


@dataclass
class GatewayStream:
    """The events of one streamed completion (each event's `data`, unchanged).

    `usage` is what the stream reported (its last usable `usage` object); when it reported
    none, the attempt is billed on an upper bound: the request's bytes for the prompt and the
    bytes of the text it streamed for the completion (a token is at least one byte) — or, for
    a stream left before its end, the request's max_tokens (`cut_short`).
    """

    _gateway: GatewayClient
    _call: _Call
    _opened: _Opened
    max_s: float | None = None  # the whole attempt's bound, events or not (None: unbounded)
    usage: Usage | None = None
    finish_reason: str = ""
    content_bytes: int = 0
    size: int = 0  # characters of the events read: bounded as a buffered answer is
    _outcome: Outcome = Outcome.ok
    _error: str | None = None
    _recorded: bool = False
    _done: bool = field(default=False)

    async def __aiter__(self) -> AsyncIterator[str]:
        """Each event's data as it arrives, `[DONE]` included; raises GatewayUnavailable when
        the gateway stops answering mid-stream — or closes it without `[DONE]`: a cut answer
        must not read as a whole one (billed all the same: it was generated)."""
        opened = self._opened
        event: ServerSentEvent | None = opened.first
        while event is not None:
            self.size += len(event.data)
            if self.size > self._call.answer_limit:
                await self._refuse_oversized()
            self._observe(event.data)
            yield event.data
            if event.data == DONE:
                self._done = True
                return
            event = await self._next()
        self._done = True
        self._outcome, self._error = Outcome.invalid_response, "the stream ended before [DONE]"
        record = await self._record()
        raise GatewayUnavailable(f"gateway stream broke: {self._error}", (record,),
                                 deadline_hit=False)

    async def _next(self) -> ServerSentEvent | None:
        idle = self._call.timeout_s  # between events
        left = idle if self.max_s is None else (
            self._opened.started + self.max_s - time.perf_counter())
        try:
            async with asyncio.timeout(min(idle, left)):
                return await anext(self._opened.events)
        except StopAsyncIteration:
            return None
        except (httpx.TimeoutException, TimeoutError):
            self._outcome = Outcome.timeout
            self._error = (f"stream longer than {self.max_s:g} s" if left < idle
                           else "stream stalled")
        except (httpx.RequestError, SSEError) as exc:
            self._outcome = Outcome.connection_error
            self._error = self._gateway.scrub(f"{type(exc).__name__}: {exc}")
        record = await self._record()
        raise GatewayUnavailable(f"gateway stream broke: {self._error}", (record,),
                                 deadline_hit=False)

    async def _refuse_oversized(self) -> None:
        # refused, the rest unread: it may go on generating, billed as a stream cut short
        self._outcome = Outcome.invalid_response
        self._error = f"answer over its bound of {self._call.answer_limit} bytes"
        record = await self._record()
        raise GatewayUnavailable(f"gateway stream refused: {self._error}", (record,),
                                 deadline_hit=False)

    def _observe(self, data: str) -> None:
        if data == DONE:
            return
        chunk = _loads(data.encode())
        if not isinstance(chunk, dict):
            return
        if isinstance(chunk.get("usage"), dict):
            self.usage = _usage_of(chunk)
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            self.content_bytes += _text_bytes(choice.get("delta"))
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]

    async def _record(self) -> AttemptRecord:
        """The attempt, recorded once (the after-attempt hook runs here)."""
        opened, call = self._opened, self._call
        if self._recorded:
            return call.attempts[-1]
        self._recorded = True
        usage = self.usage
        reported = usage is not None
        if usage is None:
            usage = Usage(len(call.body), self.content_bytes)
        status = opened.response.status_code
        # a stream left mid-way (its reader gone, a stall, a broken connection) may go on
        # generating until the gateway notices: the text seen does not bound it
        record = AttemptRecord(opened.number, status, self._outcome, usage,
                               time.perf_counter() - opened.started, self._error, None,
                               usage_reported=reported, cut_short=not self._done)
        call.attempts.append(record)
        if call.after is not None:
            await call.after(record)
        return record

    def result(self) -> ChatResult:
        """Every attempt made (after the stream closed)."""
        return ChatResult("", self.finish_reason, self.usage or Usage(), tuple(self._call.attempts))

    async def _close(self) -> None:
        try:
            if not self._recorded and not self._done:
                # the reader stopped early (its client went away): bill what was seen
                self._error = "stream abandoned by the reader"
            await asyncio.shield(self._record())
        finally:
            await self._opened.response.aclose()


def stream(
    gateway: GatewayClient,
    body: bytes,
    *,
    idempotency_key: str | None = None,
    max_attempts: int = 3,
    timeout_s: float = 60.0,
    before_attempt: BeforeAttempt | None = None,
    after_attempt: AfterAttempt | None = None,
    max_s: float | None = None,
) -> AbstractAsyncContextManager[GatewayStream]:
    """A streamed completion through `gateway` (`body` asks for `"stream": true`): attempts
    are retried until one delivers its first event, then its events are read as they come;
    `timeout_s` bounds the wait for each event, `max_s` the attempt whole (from its send)."""
    call = gateway.new_call(body, idempotency_key, max_attempts, timeout_s, None,
                            before_attempt, after_attempt)
    call.answer_limit = limit_of(body)
    return open_stream(gateway, call, max_s)


@asynccontextmanager
async def open_stream(gateway: GatewayClient, call: _Call,
                      max_s: float | None = None) -> AsyncIterator[GatewayStream]:
    """Attempts until one delivers its first event (or the retries give up: GatewayError)."""
    opened: _Opened = await gateway.retrying(call)(_attempt, gateway, call)
    stream = GatewayStream(gateway, call, opened, max_s)
    try:
        yield stream
    finally:
        await stream._close()


async def _attempt(gateway: GatewayClient, call: _Call) -> _Opened:
    number = len(call.attempts) + 1
    if call.before is not None:
        await call.before(number)
    timeout = call.timeout_s
    client = gateway.stream_client()
    started = time.perf_counter()
    response: httpx.Response | None = None
    failed: AttemptRecord | None = None
    handed = False  # once the first event is in, the stream is GatewayStream's
    try:
        try:
            async with asyncio.timeout(timeout):  # to the first event, like a plain attempt
                request = client.build_request(
                    "POST", gateway.url, content=call.body, headers=call.headers,
                    timeout=httpx.Timeout(timeout,
                                          connect=min(gateway.connect_timeout_s, timeout)))
                response = await client.send(request, stream=True)
                if not 200 <= response.status_code < 300:
                    raw = await _read_capped(response)
                    failed = gateway.failed_record(number, response.status_code,
                                                   response.headers, raw,
                                                   time.perf_counter() - started)
                else:
                    events = EventSource(capped(response)).aiter_sse()
                    first = await anext(events)
                    handed = True
                    return _Opened(number, response, events, first, started)
        except (httpx.TimeoutException, TimeoutError):
            failed = _failed(number, response, Outcome.timeout,
                             f"no first event within {timeout:.3g} s", started)
        except StopAsyncIteration:
            failed = _failed(number, response, Outcome.invalid_response,
                             "the stream ended before its first event", started)
        except SSEError as exc:
            failed = _failed(number, response, Outcome.invalid_response, gateway.scrub(str(exc)),
                             started)
        except httpx.RequestError as exc:
            failed = _failed(number, response, Outcome.connection_error,
                             gateway.scrub(f"{type(exc).__name__}: {exc}"), started)
    finally:
        if not handed and response is not None:
            await response.aclose()
    assert failed is not None
    await call.finish(failed)  # raises: retried, rejected or given up
    raise AssertionError("unreachable: finish raises for a failed attempt")


async def _read_capped(response: httpx.Response) -> bytes:
    out = bytearray()
    async for piece in response.aiter_bytes():
        out += piece
        if len(out) >= _ERROR_BODY_BYTES:
            break
    return bytes(out[:_ERROR_BODY_BYTES])


def _failed(number: int, response: httpx.Response | None, outcome: Outcome, error: str,
            started: float) -> AttemptRecord:
    status = response.status_code if response is not None else None
    return AttemptRecord(number, status, outcome, Usage(), time.perf_counter() - started,
                         error, None)


def _text_bytes(delta: object) -> int:
    """The UTF-8 bytes of every text a chunk's delta carries — content, reasoning, tool calls'
    names and arguments: what the tokens generated were, so their count bounds them. (A
    loop, not recursion: a chunk nested as deep as the JSON parser allows must not overflow.)"""
    total, todo = 0, [delta]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            total += len(item.encode("utf-8", "replace"))
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return total
