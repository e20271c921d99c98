"""Reading a gateway's answer: its status's class, its body's choice and usage, its wait hint."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import pydantic_core

from app.gateway.chat import Outcome, ToolCallRequest, Usage
from app.text import storable

_STATUS_OUTCOMES: dict[int, Outcome] = {429: Outcome.rate_limited, 408: Outcome.timeout}
# no call is billed a billion tokens: a larger count is not a usage (nor storable in every
# column and trace attribute that carries it)
_COUNT_MAX = 10**9

_Choice = tuple[str, str, tuple[ToolCallRequest, ...]]


def _classify(status: int) -> Outcome:
    """The outcome of a non-2xx status; client_error other than 409 is the one not retried."""
    # 409 (a conflicting in-flight request with the same key) may clear, so it is retried; other
    # 4xx, and 1xx/3xx (a misconfigured base URL), would fail the same way again.
    return _STATUS_OUTCOMES.get(status) or (
        Outcome.server_error if status >= 500 else Outcome.client_error)


def _loads(raw: bytes) -> Any:
    """The JSON body, or None for anything that does not decode: a bad answer, never a crash.
    pydantic-core reads an answer in a quarter of the standard library's time; what it refuses
    (a lone surrogate escape, a BOM, UTF-16, and what is no JSON at all) is read again by
    `json`, whose reading of every body stays the one that counts."""
    try:
        return pydantic_core.from_json(raw)
    except ValueError:
        pass
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
