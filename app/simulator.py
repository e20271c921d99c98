"""The built-in OpenAI-compatible simulated gateway (SPEC §6): deterministic answers and faults."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass, field, fields
from email.utils import formatdate
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive

from app import simulator_tools as sim_tools

MODELS = ("kimi-k2.5", "deepseek-v3.2", "gpt-4.1", "claude-sonnet-4.5", "gemini-2.5-flash")
PLAN_HINTS = ("deepseek-v3.2", "gemini-2.5-flash")
MAX_KEYS = 20_000  # bound on every per-key table, so a long benchmark cannot grow memory forever
_MAX_CONTENT = 64_000  # characters; a huge max_tokens must not make one answer expensive
_WATCH_DISCONNECT_S = 1.0  # waits this long or longer also watch for a client disconnect
_JSON = "application/json"
_HTML_502 = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                409: "conflict_error", 422: "invalid_request_error", 429: "rate_limit_error",
                529: "overloaded_error"}
_FAIL_KINDS = frozenset({"html502", "timeout", "truncated"})
_PLAN_KINDS = frozenset({"cyclic", "unknown_dep", "truncated", "not_json", "empty",
                         "too_many", "too_deep", "duplicate"})
# `[[sim key=value key="quoted \" value"]]`; the second pattern splits one block into pairs
_DIRECTIVE = re.compile(r'\[\[sim((?:\s+\w+=(?:"(?:[^"\\]|\\.)*"|[^\s"\]]+))*)\s*\]\]')
_PAIR = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|([^\s"\]]+))')
_UNESCAPE = re.compile(r"\\(.)")


def _build_corpus(size: int) -> str:
    """Pseudo-prose built once at import; answers are slices of it, so they cost no hashing."""
    words = ("the", "swarm", "agent", "result", "analysis", "shows", "that", "a", "service",
             "latency", "budget", "model", "risk", "review", "we", "should", "consider",
             "data", "migration", "test", "plan", "because", "and", "with", "each", "step",
             "output", "is", "consistent", "for", "payment", "gateway")
    out: list[str] = []
    total, block = 0, b"swarm-sim"
    while total < size:
        block = hashlib.sha256(block).digest()
        for byte in block:
            word = words[byte % len(words)] + ("." if byte % 13 == 0 else "")
            out.append(word)
            total += len(word) + 1
    return " ".join(out)


_CORPUS = _build_corpus(_MAX_CONTENT * 2)


@dataclass
class SimulatorConfig:
    """Latency, fault rates and auth of the simulator; faults are fractions of all requests."""

    latency_ms: float = 200.0
    latency_jitter_ms: float = 0.0
    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_502_html: float = 0.0
    rate_timeout: float = 0.0
    rate_truncated: float = 0.0
    rate_length: float = 0.0
    retry_after_s: float = 1.0
    timeout_s: float = 120.0
    api_key: str | None = None
    seed: int = 0
    # `[[sim when=<flag> ...]]` blocks apply only while their flag is here (a fault a test can
    # switch off between two runs of the same prompts); SWARM_SIM_FLAGS=a,b
    flags: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        rates = self.fault_rates()
        if any(not 0.0 <= r <= 1.0 for _, r in rates) or sum(r for _, r in rates) > 1.0:
            raise ValueError("simulator fault rates must be in [0, 1] and sum to at most 1")

    def fault_rates(self) -> tuple[tuple[str, float], ...]:
        """(fault kind, rate) in the fixed order the deterministic draw walks them."""
        return (("429", self.rate_429), ("500", self.rate_500), ("html502", self.rate_502_html),
                ("timeout", self.rate_timeout), ("truncated", self.rate_truncated),
                ("length", self.rate_length))

    @classmethod
    def from_env(cls) -> SimulatorConfig:
        """Read SWARM_SIM_<FIELD> variables (e.g. SWARM_SIM_RATE_429=0.1)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = os.environ.get(f"SWARM_SIM_{f.name.upper()}")
            if raw is None:
                continue
            if f.name == "api_key":
                values[f.name] = raw or None
            elif f.name == "flags":
                values[f.name] = {x.strip() for x in raw.split(",") if x.strip()}
            else:
                values[f.name] = int(raw) if f.name == "seed" else float(raw)
        return cls(**values)


@dataclass
class SimulatorStats:
    """Counters exposed at GET /v1/_stats; tests assert on them."""

    calls: int = 0
    ok: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_in_flight_by_swarm: dict[str, int] = field(default_factory=dict)
    by_model: dict[str, int] = field(default_factory=dict)
    swarm_in_flight: dict[str, int] = field(default_factory=dict)
    plan_calls: dict[str, int] = field(default_factory=dict)
    # what a real gateway would bill: swarm -> model -> [prompt, completion, cached tokens,
    # answers] over every complete 200 answer sent (whether or not its client was still there)
    answered: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget everything except the requests still in flight."""
        self.calls = self.ok = 0
        self.max_in_flight = self.in_flight
        for table in (self.by_key, self.max_in_flight_by_swarm, self.by_model, self.plan_calls,
                      self.answered):
            table.clear()

    def bill(self, swarm: str | None, model: str, usage: tuple[int, int, int]) -> None:
        per_model = self.answered.get(swarm or "")
        if per_model is None:
            per_model = _bounded_put(self.answered, swarm or "", {})
        tally = per_model.setdefault(model, [0, 0, 0, 0])
        for i, n in enumerate((*usage, 1)):
            tally[i] += n

    def record(self, key: str, model: str, messages: list[Any]) -> int:
        """Count one attempt of a logical call and return its attempt number (1-based)."""
        entry = self.by_key.get(key)
        if entry is None:
            entry = _bounded_put(self.by_key, key, {"calls": 0, "ok": 0, "last_messages": None})
        entry["calls"] += 1
        entry["last_messages"] = messages
        self.by_model[model] = self.by_model.get(model, 0) + 1
        return int(entry["calls"])

    def as_json(self) -> dict[str, Any]:
        """The public counters (without the internal bookkeeping tables)."""
        return {"calls": self.calls, "ok": self.ok, "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight, "by_key": self.by_key,
                "max_in_flight_by_swarm": self.max_in_flight_by_swarm, "by_model": self.by_model,
                "answered": self.answered}


def _bounded_put(table: dict[str, Any], key: str, value: Any) -> Any:
    if key not in table and len(table) >= MAX_KEYS:
        del table[next(iter(table))]  # dicts keep insertion order: drop the oldest
    table[key] = value
    return value


@dataclass
class _Directives:
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


# name -> converter, read from the annotations above ("int | None" -> int)
_CONVERTERS: dict[str, type[Any]] = {
    f.name: {"int": int, "float": float}.get(str(f.type).split()[0], str)
    for f in fields(_Directives)
}


def _parse_directives(texts: list[str], flags: set[str] | None = None) -> _Directives:
    """Collect every `[[sim ...]]` of every message in order; a later key wins. A block with
    `when=<flag>` counts only while `flags` holds that flag."""
    d = _Directives()
    for text in texts:
        if "[[sim" not in text:
            continue
        for block in _DIRECTIVE.finditer(text):
            pairs = _PAIR.findall(block.group(1))
            when = [bare or _UNESCAPE.sub(r"\1", quoted) for name, quoted, bare in pairs
                    if name == "when"]
            if any(flag not in (flags or set()) for flag in when):
                continue
            for name, quoted, bare in pairs:
                if name == "when":
                    continue
                if name not in _CONVERTERS:
                    raise ValueError(f"unknown simulator directive {name!r}")
                try:
                    setattr(d, name, _CONVERTERS[name](bare or _UNESCAPE.sub(r"\1", quoted)))
                except ValueError:
                    raise ValueError(f"bad value for simulator directive {name}") from None
    fail = d.fail
    status_ok = fail is None or fail in _FAIL_KINDS or (fail.isdigit() and 400 <= int(fail) < 600)
    if not status_ok:
        raise ValueError(f"bad simulator directive fail={fail}")
    if d.plan is not None and d.plan not in _PLAN_KINDS:
        raise ValueError(f"bad simulator directive plan={d.plan}")
    return d


@dataclass
class _ChatRequest:
    model: str
    messages: list[Any]
    texts: list[str]
    max_tokens: int | None
    json_mode: bool
    stream: bool = False
    include_usage: bool = False
    tools: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def _parse_request(raw: bytes) -> _ChatRequest:
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
    return _ChatRequest(model, messages, [_text_of(m.get("content")) for m in messages],
                        max_tokens, json_mode, stream, include_usage, tools)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts (seed, call id, attempt, purpose)."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


_POISON = "\x00 nul \udfff lone surrogate"  # what no database column can store


def _dumps(obj: Any) -> bytes:
    # ASCII escapes only when needed: a lone surrogate has no UTF-8 form, its escape does
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def _error(status: int, message: str, headers: dict[str, str] | None = None,
           poison: bool = False) -> Response:
    err_type = _ERROR_TYPES.get(status, "server_error")
    message = f"{message} {_POISON}" if poison else message
    body = _dumps({"error": {"message": message, "type": err_type, "code": status}})
    return Response(body, status_code=status, headers=headers, media_type=_JSON)


def _plan(task: str, kind: str | None, size: int | None, tools: list[str] | None = None) -> str:
    """A plan shaped by the task; `kind` names the flaw a planner test wants."""
    if kind == "not_json":
        return f"Sure! Here is a plan for {task}:\n1. research\n2. write the report"
    n = size if size is not None else {"too_many": 100, "too_deep": 12}.get(kind or "", 4)
    words = ("research", "analysis", "review")
    ids = [f"{words[i % 3]}_{i + 1}" if i < n - 1 or n == 1 else f"report_{n}" for i in range(n)]
    deps: list[list[str]] = [[] for _ in ids]
    if kind == "too_deep":
        deps = [[ids[i - 1]] if i else [] for i in range(n)]
    elif kind != "too_many" and n > 1:
        deps[-1] = ids[: min(2, n - 1)]
    if kind == "cyclic" and n > 1:
        deps[0] = [ids[-1]]
    elif kind == "unknown_dep" and n:
        deps[-1] = [*deps[-1], "missing_step"]
    elif kind == "duplicate" and n > 1:
        ids[1] = ids[0]
    subtasks = [{"id": sid, "description": f"{sid.split('_')[0].capitalize()} step {i + 1}: {task}",
                 "depends_on": dep, "model_hint": PLAN_HINTS[i % 2],
                 **({"tools": tools} if tools else {})}
                for i, (sid, dep) in enumerate(zip(ids, deps, strict=True))]
    return json.dumps({"subtasks": [] if kind == "empty" else subtasks})


def _poisoned(content: str, json_mode: bool) -> str:
    """The content with a NUL and a lone surrogate; in a plan, inside every description (as
    JSON escapes, so that the plan still parses)."""
    if json_mode:
        try:
            doc = json.loads(content)
            for item in doc["subtasks"]:
                item["description"] += " " + _POISON
            return json.dumps(doc)
        except (ValueError, KeyError, TypeError):
            pass
    return f"{content} {_POISON}"


def _task_of(req: _ChatRequest) -> str:
    """The first user message (the task), without directives, cut to a short topic."""
    roles = [m.get("role") for m in req.messages]
    text = req.texts[roles.index("user")] if "user" in roles else req.texts[-1]
    return " ".join(_DIRECTIVE.sub("", text).split()[:12]) or "the task"


def _generate(model: str, digest: bytes, size: int) -> str:
    """About `size` characters: a line naming the model, then a slice of the corpus."""
    head = f"[{model}] simulated answer {digest[:4].hex()}\n"
    size = max(0, min(size, _MAX_CONTENT) - len(head))
    start = _CORPUS.find(" ", int.from_bytes(digest[4:8], "big") % _MAX_CONTENT) + 1
    return head + _CORPUS[start : start + size]


def _message(content: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    if calls:
        return {"role": "assistant", "content": None, "tool_calls": calls}
    return {"role": "assistant", "content": content}


async def _wait(receive: Receive, seconds: float) -> bool:
    """Sleep; long waits end early (False) when the client disconnects, as a real server would."""
    if seconds < _WATCH_DISCONNECT_S:
        await asyncio.sleep(max(seconds, 0.0))
        return True

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({watcher}, timeout=seconds)
        return not done
    finally:
        watcher.cancel()


class _Simulator:
    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.stats = SimulatorStats()

    async def chat(self, request: Request) -> Response:
        stats, idem = self.stats, request.headers.get("idempotency-key")
        swarm = idem.split(":", 1)[0] if idem else None
        stats.calls += 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        if swarm is not None:
            now = stats.swarm_in_flight[swarm] = stats.swarm_in_flight.get(swarm, 0) + 1
            if now > stats.max_in_flight_by_swarm.get(swarm, 0):
                stats.max_in_flight_by_swarm.pop(swarm, None)  # re-insert: keeps eviction LRU-ish
                _bounded_put(stats.max_in_flight_by_swarm, swarm, now)
        try:
            return await self._answer(request, idem, swarm)
        finally:
            stats.in_flight -= 1
            if swarm is not None:
                left = stats.swarm_in_flight.pop(swarm, 1) - 1
                if left > 0:
                    stats.swarm_in_flight[swarm] = left

    async def _answer(self, request: Request, idem: str | None, swarm: str | None) -> Response:
        cfg = self.config
        auth = request.headers.get("authorization")
        if cfg.api_key is not None and auth != f"Bearer {cfg.api_key}":
            return _error(401, "invalid or missing API key")
        raw = await request.body()
        try:
            req = _parse_request(raw)
            d = _parse_directives(req.texts, cfg.flags)
        except ValueError as exc:
            return _error(400, str(exc))
        key = idem or hashlib.blake2b(raw, digest_size=16).hexdigest()
        attempt = self.stats.record(key, req.model, req.messages)
        fault = self._fault(d, key, attempt)
        if fault == "timeout":
            wait = d.hang_s if d.hang_s is not None else cfg.timeout_s
        elif d.latency_ms is not None:
            wait = d.latency_ms / 1000
        else:
            jitter = cfg.latency_jitter_ms * (2 * _unit(cfg.seed, key, attempt, "jitter") - 1)
            wait = max(0.0, cfg.latency_ms + jitter) / 1000
        if not await _wait(request.receive, wait):
            return Response(status_code=499)  # nobody is listening any more
        if fault == "html502":
            headers = self._retry_headers("502", d)
            return Response(_HTML_502, status_code=502, headers=headers, media_type="text/html")
        if fault is not None and fault.isdigit():
            return _error(int(fault), f"simulated {fault} error", self._retry_headers(fault, d),
                          poison=bool(d.poison))
        completion = self._completion(req, d, key, attempt, fault == "length", swarm)
        if req.stream:
            events = _stream_events(completion, req.include_usage)
            if fault == "truncated":  # the stream breaks off: no finish, no usage, no [DONE]
                events = events[: max(1, len(events) // 3)]
            else:
                self._count_ok(key, swarm, completion)
            return StreamingResponse(iter(events), media_type="text/event-stream")
        body = _dumps(completion)
        if fault == "truncated":
            return Response(body[: len(body) // 2], media_type=_JSON)
        self._count_ok(key, swarm, completion)
        return Response(body, media_type=_JSON)

    def _count_ok(self, key: str, swarm: str | None, completion: dict[str, Any]) -> None:
        self.stats.ok += 1
        u = completion["usage"]
        cached = u["prompt_tokens_details"]["cached_tokens"]
        self.stats.bill(swarm, completion["model"],
                        (u["prompt_tokens"], u["completion_tokens"], cached))
        if key in self.stats.by_key:  # it may have been evicted while this call waited
            self.stats.by_key[key]["ok"] += 1

    def _fault(self, d: _Directives, key: str, attempt: int) -> str | None:
        if d.fail is not None and (d.times is None or attempt <= d.times):
            return d.fail
        rates = self.config.fault_rates()  # read per request: tests may change the config live
        if not any(rate for _, rate in rates):
            return None
        draw = _unit(self.config.seed, key, attempt, "fault")
        for kind, rate in rates:
            if draw < rate:
                return kind
            draw -= rate
        return None

    def _retry_headers(self, status: str, d: _Directives) -> dict[str, str]:
        headers: dict[str, str] = {}
        if status == "429":
            headers["Retry-After"] = f"{self.config.retry_after_s:g}"
        if d.retry_after is not None:
            headers["Retry-After"] = d.retry_after
        if d.retry_after_date:
            headers["Retry-After"] = formatdate(time.time() + 2, usegmt=True)
        if d.retry_after_ms is not None:
            headers["retry-after-ms"] = d.retry_after_ms
        return headers

    def _bad_plan(self, d: _Directives, swarm: str | None) -> str | None:
        """The flaw for this planning call: `plan_times` counts per swarm (or per simulator)."""
        if d.plan is None:
            return None
        scope = f"{swarm or ''}|{d.plan}"
        n = self.stats.plan_calls.get(scope, 0) + 1
        _bounded_put(self.stats.plan_calls, scope, n)
        return d.plan if d.plan_times is None or n <= d.plan_times else None

    def _completion(self, req: _ChatRequest, d: _Directives, key: str, attempt: int,
                    length: bool, swarm: str | None) -> dict[str, Any]:
        """The chat.completion body: deterministic content and realistic usage."""
        # ceil(chars / 4) <= UTF-8 bytes, so prompt <= bytes + 8 per message (budget logic relies
        # on that bound); only a prompt_tokens directive may break it
        prompt = math.ceil(sum(len(t) for t in req.texts) / 4) + 4 * len(req.texts)
        limit = req.max_tokens or 4096
        length = length or d.finish == "length"
        tokens: int | None = None  # set when the content was generated to a token count
        calls: list[dict[str, Any]] = []
        if req.tools and sim_tools.turns_done(req.messages) < (d.turns or 1):
            calls = sim_tools.tool_calls(req.tools, _task_of(req),
                                         sim_tools.turns_done(req.messages) + 1, d.extra_tool)
            content = ""
            tokens = min(limit, max(1, len(json.dumps(calls)) // 4))
        elif req.tools:
            content = sim_tools.final_answer(req.messages)
        elif d.answer is not None:
            content = d.answer
        elif req.json_mode:
            flaw = self._bad_plan(d, swarm)
            content = _plan(_task_of(req), flaw, d.plan_size,
                            sim_tools.offered_to_planner(req.texts))
            if flaw == "truncated":
                content, length = content[: len(content) // 2], True
        else:
            digest = hashlib.sha256("\x00".join([req.model, *req.texts]).encode()).digest()
            tokens = min(limit, 20 + int.from_bytes(digest[:4], "big") % 381)
            tokens = d.completion_tokens if d.completion_tokens is not None else tokens
            tokens = limit if length else tokens
            content = _generate(req.model, digest, tokens * 4)
        if d.poison:
            content = _poisoned(content, req.json_mode)
        if length:
            completion = limit
        elif d.completion_tokens is not None:
            completion = d.completion_tokens
        else:
            completion = tokens or min(limit, max(1, math.ceil(len(content) / 4)))
        prompt = d.prompt_tokens if d.prompt_tokens is not None else prompt
        call_id = hashlib.blake2b(f"{key}|{attempt}".encode(), digest_size=12).hexdigest()
        return {
            "id": f"chatcmpl-sim{call_id}", "object": "chat.completion",
            "created": int(time.time()), "model": req.model,
            "choices": [{"index": 0, "message": _message(content, calls),
                         "finish_reason": "length" if length else
                         ("tool_calls" if calls else "stop")}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": d.cached_tokens or 0}},
        }

    async def stats_endpoint(self, request: Request) -> Response:
        if request.method == "POST":  # /v1/_reset
            self.stats.reset()
        return Response(_dumps(self.stats.as_json()), media_type=_JSON)

    async def models_endpoint(self, request: Request) -> Response:
        data = [{"id": m, "object": "model", "owned_by": "swarm-sim"} for m in MODELS]
        return Response(_dumps({"object": "list", "data": data}), media_type=_JSON)


def _stream_events(completion: dict[str, Any], include_usage: bool,
                   piece: int = 64) -> list[bytes]:
    """A completion as `chat.completion.chunk` events (OpenAI's streaming shape): the role,
    the content in pieces, the finish reason, the usage when asked for, then [DONE]."""
    choice = completion["choices"][0]
    content: str = choice["message"]["content"]
    head = {"id": completion["id"], "object": "chat.completion.chunk",
            "created": completion["created"], "model": completion["model"]}

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + _dumps(chunk) + b"\n\n"

    events = [event({"role": "assistant", "content": ""})]
    events += [event({"content": content[i : i + piece]}) for i in range(0, len(content), piece)]
    events.append(event({}, choice["finish_reason"]))
    if include_usage:
        usage = {**head, "choices": [], "usage": completion["usage"]}
        events.append(b"data: " + _dumps(usage) + b"\n\n")
    return [*events, b"data: [DONE]\n\n"]


def create_simulator(config: SimulatorConfig | None = None) -> Starlette:
    """The simulator as an ASGI app; `app.state.stats` is its SimulatorStats."""
    sim = _Simulator(config or SimulatorConfig())
    app = Starlette(routes=[
        Route("/v1/chat/completions", sim.chat, methods=["POST"]),
        Route("/v1/models", sim.models_endpoint, methods=["GET"]),
        Route("/v1/_stats", sim.stats_endpoint, methods=["GET"]),
        Route("/v1/_reset", sim.stats_endpoint, methods=["POST"]),
    ])
    app.state.stats = sim.stats
    app.state.config = sim.config
    return app


def run_simulator(host: str, port: int, config: SimulatorConfig | None = None) -> None:
    """Serve the simulator with uvicorn (its own process, for benchmarks and demos)."""
    uvicorn.run(create_simulator(config or SimulatorConfig.from_env()), host=host, port=port,
                access_log=False, log_level="warning")
