"""Client for an OpenAI-compatible chat-completions gateway: one call, classified and retried."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, NoReturn
from urllib.parse import urlsplit

import httpx
import pydantic_core
from tenacity import AsyncRetrying, RetryCallState

from app import tracing
from app.gateway.deltas import REFUSED, post_streamed
from app.gateway.redact import MASK, Redactor
from app.gateway.wire import (
    MAX_ANSWER_BYTES,
    AiohttpWire,
    Answer,
    HttpxWire,
    Wire,
    WireError,
    answer_limit,
    limit_of,
)
from app.states import AttemptOutcome
from app.text import storable

Outcome = AttemptOutcome  # the answered ones (states.ANSWERED): the client never writes ahead

log = logging.getLogger(__name__)

MAX_WAIT_S = 60.0
BACKOFF_BASE_S = 0.5
_DETAIL_CHARS = 200
_STATUS_OUTCOMES: dict[int, Outcome] = {429: Outcome.rate_limited, 408: Outcome.timeout}


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts as the gateway reported them; cached tokens are part of prompt_tokens."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def within(self, prompt_bound: int, completion_bound: int) -> Usage:
        """These counts, none above what the request could be billed for: its prompt's bound
        and its max_tokens (the reservation's worst case is priced on the same two)."""
        if self.prompt_tokens <= prompt_bound and self.completion_tokens <= completion_bound:
            return self
        prompt = min(self.prompt_tokens, prompt_bound)
        return Usage(prompt, min(self.completion_tokens, completion_bound),
                     min(self.cached_tokens, prompt))


_NO_USAGE = Usage()
# no call is billed a billion tokens: a larger count is not a usage (nor storable in every
# column and trace attribute that carries it)
_COUNT_MAX = 10**9


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One logical chat completion; idempotency_key is sent unchanged on every retry."""

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int
    temperature: float | None = None
    response_format: dict[str, Any] | None = None
    idempotency_key: str | None = None
    tools: list[dict[str, Any]] | None = None  # OpenAI `tools` (function definitions)
    # given: the call streams, and each piece of its text is handed here as it comes
    on_delta: Callable[[str], None] | None = None


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """What one HTTP attempt did; a failed attempt that reports usage is billed."""

    attempt: int
    status_code: int | None
    outcome: Outcome
    usage: Usage
    latency_s: float
    error: str | None
    retry_after_s: float | None
    # False when a 2xx answer (or a stream) reported no usable usage: `usage` is then an upper
    # bound from the bytes sent and received, which the caller's bounds tighten
    usage_reported: bool = True
    # a stream left before its end: the completion it was billed is not bounded by the text
    # seen (the gateway generates on until it notices), only by the request's max_tokens
    cut_short: bool = False


@dataclass(frozen=True, slots=True)
class ChatResult:
    """A successful completion and every attempt it took. `sanitized`: the content had NUL or
    lone surrogates (no database stores them), replaced by U+FFFD."""

    content: str
    finish_reason: str
    usage: Usage
    attempts: tuple[AttemptRecord, ...]
    body: Any = None  # the parsed answer, for callers that forward it unchanged
    tool_calls: tuple[ToolCallRequest, ...] = ()
    sanitized: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """One function call the model asked for; `arguments` is the model's JSON text, unparsed."""

    id: str
    name: str
    arguments: str


class GatewayError(Exception):
    """A call that did not succeed; carries every attempt made."""

    def __init__(self, message: str, attempts: tuple[AttemptRecord, ...]) -> None:
        super().__init__(message)
        self.attempts = attempts
        last = attempts[-1] if attempts else None
        self.status_code: int | None = last.status_code if last else None
        # No attempt at all only happens when the deadline had already passed.
        self.outcome: Outcome = last.outcome if last else Outcome.timeout


class GatewayRejected(GatewayError):
    """The gateway refused the request (a non-retryable 4xx); retrying would not help."""


class GatewayUnavailable(GatewayError):
    """Retryable failures until max_attempts or the deadline ran out."""

    def __init__(
        self, message: str, attempts: tuple[AttemptRecord, ...], *, deadline_hit: bool
    ) -> None:
        super().__init__(message, attempts)
        self.deadline_hit = deadline_hit


_Choice = tuple[str, str, tuple[ToolCallRequest, ...]]
BeforeAttempt = Callable[[int], Awaitable[None]]
AfterAttempt = Callable[[AttemptRecord], Awaitable[None]]


class _Retryable(Exception):
    """Internal: the attempt failed in a way tenacity should retry."""


async def _sleep(seconds: float) -> None:
    # A module-level hook so tests can observe retry waits without sleeping them.
    await asyncio.sleep(seconds)


def _classify(status: int) -> Outcome:
    """The outcome of a non-2xx status; client_error other than 409 is the one not retried."""
    # 409 (a conflicting in-flight request with the same key) may clear, so it is retried; other
    # 4xx, and 1xx/3xx (a misconfigured base URL), would fail the same way again.
    return _STATUS_OUTCOMES.get(status) or (
        Outcome.server_error if status >= 500 else Outcome.client_error)


def _loads(raw: bytes) -> Any:
    """The JSON body, or None for anything that does not decode: a bad answer, never a crash."""
    try:
        return json.loads(raw)
    # ValueError: JSONDecodeError, UnicodeDecodeError, an int of too many digits;
    # RecursionError: nesting deeper than the interpreter's stack
    except (ValueError, RecursionError):
        return None


def _count(value: object) -> int | None:
    """A token count, or None: a bool, a float, a string, a negative or absurd number is none."""
    return value if type(value) is int and 0 <= value <= _COUNT_MAX else None


def _usage_of(body: Any) -> Usage | None:
    """The usage an answer reports, or None when it reports none that can be billed: absent,
    or prompt or completion tokens not a count (a string, a float, negative, absurd)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    details = usage.get("prompt_tokens_details")
    # an unreadable cached count bills the prompt at the full price: never less than it cost
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(prompt, completion, cached or 0)


def billed_usage(body: Any, sent: bytes, received: int) -> tuple[Usage, bool]:
    """What a 2xx answer is billed: its reported usage, or, when it reports none usable, an
    upper bound (a token is at least a byte: the bytes sent, the bytes received) — the gateway
    produced the answer and bills it whatever it says. The flag: the usage was reported."""
    usage = _usage_of(body)
    if usage is None:
        return Usage(len(sent), received), False
    return usage, True


def _any_choice(body: Any) -> _Choice | None:
    """A forwarded answer only needs a non-empty `choices` list (tool calls, several choices
    and null content are the caller's business)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else None
    finish = choices[0].get("finish_reason")
    return (content if isinstance(content, str) else "",
            finish if isinstance(finish, str) else "", ())


def _choice_of(body: Any) -> _Choice | None:
    """(content, finish_reason, tool calls) of the first choice, or None for a wrong shape."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return None
    calls = _tool_calls_of(message.get("tool_calls"))
    if calls is None or ("content" not in message and not calls):  # no answer at all
        return None
    content = _text_of(message.get("content"))
    if content is None:
        return None
    finish = choices[0].get("finish_reason")
    return content, finish if isinstance(finish, str) else "", calls


def _text_of(content: object) -> str | None:
    """A message's text: a string, null (a tool-calling answer; some gateways leave the key
    out), or a list of text parts (as some gateways answer); None for anything else."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "".join(p["text"] for p in content)
    return None


def _storable_calls(calls: tuple[ToolCallRequest, ...]
                    ) -> tuple[tuple[ToolCallRequest, ...], bool]:
    """Tool calls as the transcript can store them (ids, names, arguments cleaned)."""
    out, changed = [], False
    for c in calls:
        (cid, a), (name, b), (args, d) = storable(c.id), storable(c.name), storable(c.arguments)
        out.append(ToolCallRequest(cid, name, args))
        changed = changed or a or b or d
    return tuple(out), changed


def _tool_calls_of(raw: Any) -> tuple[ToolCallRequest, ...] | None:
    """The message's `tool_calls` (absent: none), or None when malformed."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        return None
    out: list[ToolCallRequest] = []
    for call in raw:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            return None
        cid, name, args = call.get("id"), fn.get("name"), fn.get("arguments", "")
        if not (isinstance(cid, str) and cid and isinstance(name, str) and isinstance(args, str)):
            return None
        out.append(ToolCallRequest(cid, name, args))
    return tuple(out)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """The server's wait hint in seconds: retry-after-ms, else Retry-After (seconds or date);
    a proxy's renamed copies (LiteLLM's `llm_provider-` prefix) count when the plain ones are
    absent."""
    millis = headers.get("retry-after-ms") or headers.get("llm_provider-retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return max(value, 0.0)
    text = headers.get("retry-after") or headers.get("llm_provider-retry-after")
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        value = (when - datetime.now(UTC)).total_seconds()
    return max(value, 0.0) if math.isfinite(value) else None


def _wait_s(record: AttemptRecord) -> float:
    """The pause before the next attempt: the server's hint, else full-jitter backoff; capped."""
    if record.retry_after_s is not None:
        return min(record.retry_after_s, MAX_WAIT_S)
    ceiling = BACKOFF_BASE_S * 2.0 ** min(record.attempt - 1, 16)
    return random.uniform(0.0, min(ceiling, MAX_WAIT_S))


@dataclass(slots=True)
class _Call:
    """The state of one complete() call, read by the tenacity policy callables."""

    body: bytes
    headers: dict[str, str] | None
    max_attempts: int
    timeout_s: float
    deadline: float | None
    before: BeforeAttempt | None
    after: AfterAttempt | None
    attempts: list[AttemptRecord] = field(default_factory=list)
    deadline_hit: bool = False
    accept: Callable[[Any], _Choice | None] = _choice_of
    request: ChatRequest | None = None  # what `chat` spans describe (None: a forwarded body)
    secret: str = ""  # the gateway's key: masked in what an answer echoes of it
    # the body asking for a stream (ChatRequest.on_delta); None once the gateway refused one
    stream_body: bytes | None = None
    on_delta: Callable[[str], None] | None = None
    # the most its answer may hold (wire.answer_limit, from its max_tokens): past it the
    # attempt is `invalid_response` at once, the rest unread
    answer_limit: int = MAX_ANSWER_BYTES

    def retry(self, state: RetryCallState) -> bool:
        return state.outcome is not None and isinstance(state.outcome.exception(), _Retryable)

    def wait(self, state: RetryCallState) -> float:
        # tenacity asks for the wait before asking stop; after the last attempt there is none.
        if len(self.attempts) >= self.max_attempts:
            return 0.0
        return _wait_s(self.attempts[-1])

    def stop(self, state: RetryCallState) -> bool:
        # Past the deadline (even on the last attempt, cut short by it) or about to wait past it.
        if self.deadline is not None and time.monotonic() + state.upcoming_sleep >= self.deadline:
            self.deadline_hit = True
        stopping = self.deadline_hit or len(self.attempts) >= self.max_attempts
        # asked once per retryable failure, when both its class and what follows are known
        self.log_failed(None if stopping else state.upcoming_sleep)
        return stopping

    def log_failed(self, wait_s: float | None) -> None:
        """A failed attempt (SPEC §17): its status, retry class, number and the wait before
        the next (None: no next). Never its detail: a gateway's error may echo the prompt."""
        rec = self.attempts[-1]
        model = self.request.model if self.request is not None else None
        then = "giving up" if wait_s is None else f"retrying in {wait_s:.3g} s"
        log.warning("gateway attempt %d failed: %s (%s), %s", rec.attempt,
                    rec.status_code or "no answer", rec.outcome, then, extra={
                        "attempt": rec.attempt, "http_status": rec.status_code,
                        "retry_class": rec.outcome, "model": model,
                        "wait_s": None if wait_s is None else round(wait_s, 3),
                        "latency_s": round(rec.latency_s, 3)})

    def give_up(self, state: RetryCallState | None = None) -> NoReturn:
        last = self.attempts[-1] if self.attempts else None
        why = "deadline reached" if self.deadline_hit else f"{len(self.attempts)} attempts"
        detail = f": {last.outcome} ({last.error})" if last else ""
        message = f"gateway unavailable after {why}{detail}"
        raise GatewayUnavailable(message, tuple(self.attempts), deadline_hit=self.deadline_hit)

    async def finish(
        self, record: AttemptRecord, choice: _Choice | None = None, body: Any = None
    ) -> ChatResult:
        """Record an attempt, tell the caller, then return the result or raise for tenacity."""
        self.attempts.append(record)
        # what no database (nor exporter) can hold is replaced where it enters: here
        content, changed = storable(choice[0]) if choice else ("", False)
        calls, calls_changed = _storable_calls(choice[2]) if choice else ((), False)
        if self.secret and self.secret in content:  # the hot path: a search, rarely a copy
            content = content.replace(self.secret, MASK)
        failed = None if record.outcome == Outcome.ok else record.outcome
        tracing.record_chat(error=failed, status_code=record.status_code,
                            input_tokens=record.usage.prompt_tokens,
                            output_tokens=record.usage.completion_tokens,
                            finish_reason=choice[1] if choice else None,
                            output=content if choice else None)
        if self.after is not None:
            await self.after(record)
        if choice is not None:
            return ChatResult(content, storable(choice[1])[0], record.usage,
                              tuple(self.attempts), body, calls, changed or calls_changed)
        if record.outcome == Outcome.client_error and record.status_code != 409:
            self.log_failed(None)  # not retried
            raise GatewayRejected(
                f"gateway rejected the request: {record.error}", tuple(self.attempts)
            )
        raise _Retryable(record.error)


def _storable_deltas(sink: Callable[[str], None], secret: str) -> Callable[[str], None]:
    """`sink` handed each piece as the answer's content will be stored: made storable, the
    gateway's key masked."""
    def handed(text: str) -> None:
        text = storable(text)[0]
        sink(text.replace(secret, MASK) if secret and secret in text else text)
    return handed


def _chat_span(call: _Call, server: str) -> Any:
    r = call.request
    if r is not None:
        return tracing.chat_span(r.model, server, r.messages, r.max_tokens, r.temperature)
    # a forwarded body (the OpenAI facade's passthrough): read what the span needs from it
    body = _loads(call.body)
    body = body if isinstance(body, dict) else {}
    messages = body.get("messages")
    temperature = body.get("temperature")
    return tracing.chat_span(str(body.get("model", "unknown")), server,
                             messages if isinstance(messages, list) else [],
                             int(body.get("max_tokens") or 0),
                             temperature if isinstance(temperature, int | float) else None)


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
        try:
            # httpx's timeouts are per read (and ASGITransport ignores them): one for the attempt
            async with asyncio.timeout(timeout):
                answer = await self._post(call, headers, timeout)
        except TimeoutError:
            outcome = Outcome.timeout
            error = f"no response within {timeout:.3g} s"
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
