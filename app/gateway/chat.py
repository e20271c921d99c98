"""The shapes of one chat call: the request, each attempt's record, the result and the usage."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from app.states import AttemptOutcome

Outcome = AttemptOutcome  # the answered ones (states.ANSWERED): the client never writes ahead


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



BeforeAttempt = Callable[[int], Awaitable[None]]
AfterAttempt = Callable[[AttemptRecord], Awaitable[None]]
