"""One call's attempts: the state tenacity's retry policy reads, the wait between attempts,
and what each attempt's end records, logs and hands on."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from tenacity import RetryCallState

from app import tracing
from app.gateway.answers import _Choice, _choice_of, _loads, _storable_calls
from app.gateway.chat import (
    AfterAttempt,
    AttemptRecord,
    BeforeAttempt,
    ChatRequest,
    ChatResult,
    Outcome,
)
from app.gateway.errors import GatewayRejected, GatewayUnavailable
from app.gateway.redact import MASK
from app.gateway.wire import MAX_ANSWER_BYTES
from app.text import storable

# the name docs/OPERATIONS.md gives operators for a failed attempt's line
log = logging.getLogger("app.gateway.client")

MAX_WAIT_S = 60.0
BACKOFF_BASE_S = 0.5


class _Retryable(Exception):
    """Internal: the attempt failed in a way tenacity should retry."""



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
