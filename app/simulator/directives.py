"""What a request asks for: the chat request's fields, and the `[[sim key=value]]` directives
its messages carry (faults, latency, answers, plans, tool turns)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field, fields
from typing import Any

import app.simulator.tools as sim_tools
from app.simulator.structured import OUTPUT_KINDS, asked_schema

FAIL_KINDS = frozenset({"html502", "timeout", "truncated"})
PLAN_KINDS = frozenset({"cyclic", "unknown_dep", "truncated", "not_json", "empty",
                        "too_many", "too_deep", "duplicate"})
# `[[sim key=value key="quoted \" value"]]`; the second pattern splits one block into pairs
DIRECTIVE = re.compile(r'\[\[sim((?:\s+\w+=(?:"(?:[^"\\]|\\.)*"|[^\s"\]]+))*)\s*\]\]')
_PAIR = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|([^\s"\]]+))')
_UNESCAPE = re.compile(r"\\(.)")


@dataclass
class Directives:
    fail: str | None = None
    times: int | None = None
    hang_s: float | None = None
    retry_after: str | None = None
    retry_after_ms: str | None = None
    retry_after_date: int = 0
    finish: str | None = None
    latency_ms: float | None = None
    answer: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    plan: str | None = None
    plan_size: int | None = None
    plan_times: int | None = None
    turns: int | None = None  # tool-calling turns before the final answer (default 1)
    extra_tool: str | None = None  # also call this (unoffered) tool on the first turn
    poison: int = 0  # 1: answers and error bodies carry a NUL and a lone surrogate
    stream_ms: float | None = None  # a streamed answer's pieces spread over this many ms
    down: str | None = None  # models (comma-separated) that answer 503 to every call
    output: str | None = None  # a structured answer's fault: fence | prose | invalid
    reject_schema: int = 0  # 1: a json_schema response_format is refused with a 400
    exit: int | None = None  # end the process with this code mid-call (config.exit_allowed)
    answer_bytes: int | None = None  # the answer's content is this many bytes

    def is_down(self, model: str) -> bool:
        """Whether `down` names this model."""
        return self.down is not None and model in self.down.split(",")


# name -> converter, read from the annotations above ("int | None" -> int)
_CONVERTERS: dict[str, type[Any]] = {
    f.name: {"int": int, "float": float}.get(str(f.type).split()[0], str)
    for f in fields(Directives)
}


def parse_directives(texts: list[str], flags: set[str] | None = None) -> Directives:
    """Collect every `[[sim ...]]` of every message in order; a later key wins. A block with
    `when=<flag>` counts only while `flags` holds that flag."""
    d = Directives()
    for text in texts:
        if "[[sim" not in text:
            continue
        for block in DIRECTIVE.finditer(text):
            when, pairs, problem = _block(block.group(1))
            if any(flag not in (flags or ()) for flag in when):
                continue
            if problem is not None:
                raise ValueError(problem)
            for name, value in pairs:
                setattr(d, name, value)
    fail = d.fail
    status_ok = fail is None or fail in FAIL_KINDS or (fail.isdigit() and 400 <= int(fail) < 600)
    if not status_ok:
        raise ValueError(f"bad simulator directive fail={fail}")
    if d.plan is not None and d.plan not in PLAN_KINDS:
        raise ValueError(f"bad simulator directive plan={d.plan}")
    if d.output is not None and d.output not in OUTPUT_KINDS:
        raise ValueError(f"bad simulator directive output={d.output}")
    return d


@functools.lru_cache(maxsize=4096)
def _block(inside: str) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...], str | None]:
    """One block's `when` flags, its other pairs converted, and the refusal its first bad pair
    earns (raised only where the block applies). A block's text is the same in every call of
    a swarm, so each is read once: the regexes and converters stay off the request path."""
    found = [(name, bare or _UNESCAPE.sub(r"\1", quoted))
             for name, quoted, bare in _PAIR.findall(inside)]
    when = tuple(value for name, value in found if name == "when")
    pairs: list[tuple[str, Any]] = []
    for name, value in found:
        if name == "when":
            continue
        if name not in _CONVERTERS:
            return when, (), f"unknown simulator directive {name!r}"
        try:
            pairs.append((name, _CONVERTERS[name](value)))
        except ValueError:
            return when, (), f"bad value for simulator directive {name}"
    return when, tuple(pairs), None


def refuse_format(req: ChatRequest, d: Directives) -> None:
    """`reject_schema=1`: a gateway that takes no json_schema response format (a 400)."""
    if d.reject_schema and req.format_type == "json_schema":
        raise ValueError("response_format json_schema is not supported by this model; use "
                         "json_object")


@dataclass
class ChatRequest:
    model: str
    messages: list[Any]
    texts: list[str]
    max_tokens: int | None
    json_mode: bool
    stream: bool = False
    include_usage: bool = False
    tools: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    schema: dict[str, Any] | None = None  # what a structured call asks (json_schema or in text)
    format_type: str | None = None  # response_format.type


def parse_request(raw: bytes) -> ChatRequest:
    try:
        body = json.loads(raw)
    except ValueError:
        raise ValueError("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not model:
        raise ValueError("'model' is required")
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)):
        raise ValueError("'messages' must be a non-empty list of objects")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError("'max_tokens' must be a positive integer")
    fmt = body.get("response_format")
    json_mode = isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    tools = sim_tools.tool_names(body["tools"]) if body.get("tools") else []
    return ChatRequest(model, messages, [_text_of(m.get("content")) for m in messages],
                        max_tokens, json_mode, stream, include_usage, tools,
                        asked_schema(fmt, messages),
                        str(fmt.get("type")) if isinstance(fmt, dict) else None)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
