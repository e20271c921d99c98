"""Client for an OpenAI-compatible chat-completions gateway: one call, classified and retried."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
import pydantic_core
from tenacity import AsyncRetrying

from app import tracing
from app.aio import Within
from app.gateway.answers import (
    _any_choice,
    _classify,
    _loads,
    _retry_after,
    _usage_of,
    billed_usage,
)
from app.gateway.attempts import _Call, _chat_span, _Retryable, _storable_deltas
from app.gateway.chat import (
    _NO_USAGE,
    AfterAttempt,
    AttemptRecord,
    BeforeAttempt,
    ChatRequest,
    ChatResult,
    Outcome,
)
from app.gateway.deltas import REFUSED, post_streamed
from app.gateway.redact import Redactor
from app.gateway.wire import (
    AiohttpWire,
    Answer,
    HttpxWire,
    Wire,
    WireError,
    answer_limit,
    limit_of,
)
from app.text import storable

_DETAIL_CHARS = 200


async def _sleep(seconds: float) -> None:
    # A module-level hook so tests can observe retry waits without sleeping them.
    await asyncio.sleep(seconds)


class GatewayClient:
    """POSTs chat completions to one gateway, at most `max_inflight` connections per pool.

    Buffered calls go over an aiohttp pool (app/gateway/wire.py says why); streamed ones over
    an httpx pool, for the event-stream parser they use (httpx-sse). A `transport` handed in
    carries both.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str = "",
        *,
        max_inflight: int = 256,
        transport: httpx.AsyncBaseTransport | None = None,
        connect_timeout_s: float = 5.0,
        keepalive_s: float = 4.0,
    ) -> None:
        if max_inflight < 1:
            raise ValueError("max_inflight must be positive")
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._host = urlsplit(self._url).hostname or ""
        self._redact = Redactor(api_key, base_url)
        self._secret = api_key.strip()
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._transport = transport
        self._max_inflight = max_inflight
        self._connect_timeout_s = connect_timeout_s
        # An idle connection is closed by us before the server closes it: a request sent on
        # a connection the server is closing fails unread, costing an attempt and a retry.
        # 5 s (httpx's default) is the keep-alive timeout of uvicorn, Node and Apache, so the
        # two would race at exactly the moment both let go.
        self._keepalive_s = keepalive_s
        self._ssl: ssl.SSLContext | None = None
        self._streams: httpx.AsyncClient | None = None
        self._wire: Wire
        if transport is not None:
            self._wire = HttpxWire(self._url, self.stream_client(), connect_timeout_s)
        else:
            self._wire = AiohttpWire(self._url, self._headers, limit=max_inflight,
                                     keepalive_s=keepalive_s, connect_timeout_s=connect_timeout_s,
                                     ssl_context=self._ssl_context)  # loaded at first call

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:  # CA certificates loaded once (httpx's: certifi, SSL_CERT_FILE)
            self._ssl = httpx.create_ssl_context()
        return self._ssl

    def stream_client(self) -> httpx.AsyncClient:
        """The httpx client streamed calls go through (made at first use: a process that never
        streams opens nothing)."""
        if self._streams is None:
            if self._transport is not None:
                self._streams = httpx.AsyncClient(headers=self._headers,
                                                  transport=self._transport)
            else:
                n = self._max_inflight
                limits = httpx.Limits(max_connections=n, max_keepalive_connections=n,
                                      keepalive_expiry=self._keepalive_s)
                self._streams = httpx.AsyncClient(headers=self._headers, limits=limits,
                                                  verify=self._ssl_context())
        return self._streams

    def _scrub(self, text: str) -> str:
        # Redact before truncating, so a key cut in half cannot slip through; by pattern, so
        # a partly masked key or the gateway's host name does not either. Error text is
        # stored (subtask errors, events), so it is made storable too. What lies past the
        # kept part by more than any encoded key's length is never shown, so is not read.
        text = " ".join(storable(text)[0].split())[:_DETAIL_CHARS + self._redact.reach]
        return " ".join(self._redact(text).split())[:_DETAIL_CHARS]

    async def complete(
        self,
        request: ChatRequest,
        *,
        max_attempts: int = 3,
        timeout_s: float = 60.0,
        deadline: float | None = None,
        before_attempt: BeforeAttempt | None = None,
        after_attempt: AfterAttempt | None = None,
    ) -> ChatResult:
        """One chat completion, retried per SPEC §4; raises GatewayRejected or GatewayUnavailable.

        Every before_attempt(n) that returns is matched by one after_attempt(record), unless the
        attempt is cancelled. Exceptions from either callback propagate unchanged.
        """
        payload: dict[str, Any] = {"model": request.model, "messages": request.messages}
        payload["max_tokens"] = request.max_tokens
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        if request.response_format is not None:
            payload["response_format"] = request.response_format
        if request.tools:
            payload["tools"] = request.tools
        # the bytes json.dumps(ensure_ascii=False, separators=(",", ":")) makes, in a sixth of
        # its time (~0.7 us, was ~4.3 per call); text that does not encode raises ValueError
        body = pydantic_core.to_json(payload)
        call = self.new_call(body, request.idempotency_key, max_attempts, timeout_s, deadline,
                             before_attempt, after_attempt)
        call.request = request
        call.answer_limit = answer_limit(request.max_tokens)
        if request.on_delta is not None:
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
            call.stream_body = pydantic_core.to_json(payload)
            call.on_delta = _storable_deltas(request.on_delta, self._secret)
        return await self._run(call)

    async def forward(
        self,
        body: bytes,
        *,
        idempotency_key: str | None = None,
        max_attempts: int = 3,
        timeout_s: float = 60.0,
        before_attempt: BeforeAttempt | None = None,
        after_attempt: AfterAttempt | None = None,
    ) -> ChatResult:
        """A caller's own request body, sent unchanged with the same retries; the result's
        `body` is the gateway's answer (any 2xx JSON object with a `choices` list)."""
        call = self.new_call(body, idempotency_key, max_attempts, timeout_s, None,
                             before_attempt, after_attempt)
        call.accept = _any_choice
        call.answer_limit = limit_of(body)
        return await self._run(call)

    def new_call(self, body: bytes, idempotency_key: str | None, max_attempts: int,
                 timeout_s: float, deadline: float | None, before: BeforeAttempt | None,
                 after: AfterAttempt | None) -> _Call:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        headers = None if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        return _Call(body, headers, max_attempts, timeout_s, deadline, before, after,
                     secret=self._secret)

    def retrying(self, call: _Call) -> AsyncRetrying:
        """The retry policy of SPEC §4 for one logical call."""
        return AsyncRetrying(
            sleep=_sleep,
            retry=call.retry,
            wait=call.wait,
            stop=call.stop,
            retry_error_callback=call.give_up,
        )

    async def _run(self, call: _Call) -> ChatResult:
        deadline = call.deadline
        if deadline is not None and time.monotonic() >= deadline:
            call.deadline_hit = True
            call.give_up()
        # The first attempt is made before tenacity is entered: its bookkeeping (a Retrying
        # object, its action list, an `iscoroutinefunction` per action) was 9 % of the
        # engine's CPU per subtask (py-spy, 1,000 agents), and most calls succeed at once.
        # A retryable failure is then handed to tenacity as its own first attempt's outcome,
        # so every decision after it (retry, wait, stop, give up) is still tenacity's.
        try:
            return await self._attempt(call)
        except _Retryable as exc:
            first: _Retryable | None = exc

        async def attempt(call: _Call) -> ChatResult:
            nonlocal first
            if first is not None:
                failed, first = first, None
                raise failed
            return await self._attempt(call)

        result: ChatResult = await self.retrying(call)(attempt, call)
        return result

    async def _attempt(self, call: _Call) -> ChatResult:
        if not tracing.enabled():
            return await self._send(call, call.headers)
        # one `chat` span per attempt (retries are siblings); the gateway continues it
        with _chat_span(call, self._host):
            return await self._send(call, tracing.inject(call.headers))

    async def _send(self, call: _Call, headers: dict[str, str] | None) -> ChatResult:
        number = len(call.attempts) + 1
        if call.before is not None:
            await call.before(number)
        timeout = call.timeout_s
        if call.deadline is not None:
            timeout = min(timeout, call.deadline - time.monotonic())
            if timeout <= 0:  # before_attempt ate the time left: never send past the deadline
                call.deadline_hit = True
                error = "deadline passed before sending"
                return await call.finish(
                    AttemptRecord(number, None, Outcome.timeout, _NO_USAGE, 0.0, error, None)
                )
        started = time.perf_counter()
        within = Within(timeout)
        try:
            # httpx's timeouts are per read (and ASGITransport ignores them): one for the attempt
            async with within:
                answer = await self._post(call, headers, timeout)
        except TimeoutError:
            outcome = Outcome.timeout
            # the wire's own timer is the connect timeout's: the error names the one that ran out
            error = (f"no response within {timeout:.3g} s" if within.expired() else
                     f"no connection within {self._connect_timeout_s:.3g} s")
        except WireError as exc:
            if exc.undecodable:  # a body whose Content-Encoding does not decode
                outcome, error = Outcome.invalid_response, "undecodable body"
            elif exc.too_large:  # unread: a failure, billed as one (nothing it reports)
                outcome, error = Outcome.invalid_response, str(exc)
            else:
                outcome, error = Outcome.connection_error, self._scrub(str(exc))
        else:
            return await self._classified(call, number, answer, time.perf_counter() - started)
        latency = time.perf_counter() - started
        return await call.finish(
            AttemptRecord(number, None, outcome, _NO_USAGE, latency, error, None)
        )

    async def _post(self, call: _Call, headers: dict[str, str] | None,
                    timeout: float) -> Answer:
        if call.stream_body is None or call.on_delta is None:
            return await self._wire.post(call.body, headers, timeout, call.answer_limit)
        answer = await post_streamed(self.stream_client(), self._url, call.stream_body,
                                     headers, timeout, call.on_delta, call.answer_limit)
        if answer.status not in REFUSED:
            return answer
        call.stream_body = None  # a gateway that does not stream: asked plainly from now on
        return await self._wire.post(call.body, headers, timeout, call.answer_limit)

    async def _classified(
        self, call: _Call, number: int, answer: Answer, latency: float
    ) -> ChatResult:
        status = answer.status
        body = _loads(answer.content)
        if 200 <= status < 300:
            if isinstance(body, dict) and isinstance(body.get("model"), str):
                tracing.attribute("gen_ai.response.model", body["model"])
            choice = call.accept(body)
            if choice is not None:
                usage, reported = billed_usage(body, call.body, len(answer.content))
                return await call.finish(AttemptRecord(
                    number, status, Outcome.ok, usage, latency, None, None, reported), choice, body)
            # an answer not used is billed as a failure: what it reports (a bound would be
            # spend no ledger row marks unresolved)
            error = "unparseable or truncated body" if body is None else "unexpected body shape"
            return await call.finish(AttemptRecord(
                number, status, Outcome.invalid_response, _usage_of(body) or _NO_USAGE, latency,
                error, None))
        return await call.finish(
            self.failed_record(number, status, answer.headers, answer.content, latency))

    def failed_record(self, number: int, status: int, headers: Mapping[str, str], content: bytes,
                      latency: float) -> AttemptRecord:
        """The record of a non-2xx answer: outcome, scrubbed detail, the server's wait hint."""
        body = _loads(content)
        detail = body.get("error") if isinstance(body, dict) else None
        if isinstance(detail, dict):
            detail = detail.get("message")
        if not isinstance(detail, str):
            detail = content[:4096].decode("utf-8", "replace")
        error = self._scrub(f"HTTP {status}: {detail}")
        # a failure is billed only for the usage it reports (SPEC §4)
        return AttemptRecord(number, status, _classify(status), _usage_of(body) or _NO_USAGE,
                             latency, error, _retry_after(headers))

    # ---- what app/gateway/streaming.py uses ----

    @property
    def url(self) -> str:
        return self._url

    @property
    def connect_timeout_s(self) -> float:
        return self._connect_timeout_s

    def scrub(self, text: str) -> str:
        """Text safe to store or show: the gateway key masked, whitespace folded, cut short."""
        return self._scrub(text)

    async def aclose(self) -> None:
        """Close the pools opened so far."""
        streams, self._streams = self._streams, None
        await self._wire.aclose()
        if streams is not None:
            await streams.aclose()
