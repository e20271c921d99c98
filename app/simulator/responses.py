"""The simulator's answers, deterministic from the request: content (prose from a fixed corpus,
plans, tool calls), usage, the chat.completion body and its stream of chunks, error bodies."""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from json.encoder import encode_basestring as _string
from typing import Any

from starlette.responses import Response

import app.simulator.tools as sim_tools
from app.simulator.directives import DIRECTIVE, ChatRequest, Directives
from app.simulator.structured import answer as structured_answer

PLAN_HINTS = ("deepseek-v3.2", "gemini-2.5-flash")
MAX_CONTENT = 64_000  # characters; a huge max_tokens must not make one answer expensive
JSON = "application/json"
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                409: "conflict_error", 422: "invalid_request_error", 429: "rate_limit_error",
                529: "overloaded_error"}


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


_CORPUS = _build_corpus(MAX_CONTENT * 2)


def unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts (seed, call id, attempt, purpose)."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


# the planner prompt's rules (app/engine/planner.py planner_messages): a plan keeps to them
_MAX_SUBTASKS = re.compile(r"Rules: at most (\d+) subtasks;")
_MAX_DEPTH = re.compile(r"the longest dependency chain has at most (\d+) subtasks")


def _bound(pattern: re.Pattern[str], texts: list[str]) -> int | None:
    found = next((m for t in texts if (m := pattern.search(t))), None)
    return None if found is None else int(found.group(1))


_POISON = "\x00 nul \udfff lone surrogate"  # what no database column can store


_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_ENCODE_ASCII = json.JSONEncoder(separators=(",", ":")).encode


def dumps(obj: Any) -> bytes:
    # ASCII escapes only when needed: a lone surrogate has no UTF-8 form, its escape does
    try:
        return _ENCODE(obj).encode()
    except UnicodeEncodeError:
        return _ENCODE_ASCII(obj).encode()


# a chat.completion without tool calls, spelled as `dumps` spells it (the common answer: its
# JSON by hand is several times cheaper than the encoder's walk over the dict)
_COMPLETION = ('{"id":%s,"object":"chat.completion","created":%d,"model":%s,"choices":[{'
               '"index":0,"message":{"role":"assistant","content":%s},"finish_reason":%s}],'
               '"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,'
               '"prompt_tokens_details":{"cached_tokens":%d}}}')


def completion_body(completion: dict[str, Any]) -> bytes:
    """`dumps(completion)` of a `chat_completion` answer, byte for byte."""
    choice = completion["choices"][0]
    content = choice["message"]["content"]
    if not isinstance(content, str):  # tool calls: the general encoder
        return dumps(completion)
    u = completion["usage"]
    text = _COMPLETION % (
        _string(completion["id"]), completion["created"], _string(completion["model"]),
        _string(content), _string(choice["finish_reason"]), u["prompt_tokens"],
        u["completion_tokens"], u["total_tokens"], u["prompt_tokens_details"]["cached_tokens"])
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate: the ASCII escapes `dumps` falls back to
        return dumps(completion)


def error(status: int, message: str, headers: dict[str, str] | None = None,
           poison: bool = False) -> Response:
    err_type = _ERROR_TYPES.get(status, "server_error")
    message = f"{message} {_POISON}" if poison else message
    body = dumps({"error": {"message": message, "type": err_type, "code": status}})
    return Response(body, status_code=status, headers=headers, media_type=JSON)


def _plan(task: str, kind: str | None, size: int | None, tools: list[str] | None = None,
          max_subtasks: int | None = None, max_depth: int | None = None) -> str:
    """A plan shaped by the task, within the prompt's `max_subtasks` and `max_depth` unless
    `size` says otherwise; `kind` names the flaw a planner test wants."""
    if kind == "not_json":
        return f"Sure! Here is a plan for {task}:\n1. research\n2. write the report"
    most, deepest = max_subtasks or 4, max_depth or 2
    flawed = {"too_many": max(100, most + 1), "too_deep": max(12, deepest + 1)}
    n = size if size is not None else flawed.get(kind or "", min(4, most))
    words = ("research", "analysis", "review")
    ids = [f"{words[i % 3]}_{i + 1}" if i < n - 1 or n == 1 else f"report_{n}" for i in range(n)]
    deps: list[list[str]] = [[] for _ in ids]
    if kind == "too_deep":
        deps = [[ids[i - 1]] if i else [] for i in range(n)]
    elif kind != "too_many" and n > 1 and deepest > 1:
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


def _task_of(req: ChatRequest) -> str:
    """The first user message (the task), without directives, cut to a short topic."""
    roles = [m.get("role") for m in req.messages]
    text = req.texts[roles.index("user")] if "user" in roles else req.texts[-1]
    return " ".join(DIRECTIVE.sub("", text).split()[:12]) or "the task"


def _generate(model: str, digest: bytes, size: int) -> str:
    """About `size` characters: a line naming the model, then a slice of the corpus."""
    head = f"[{model}] simulated answer {digest[:4].hex()}\n"
    size = max(0, min(size, MAX_CONTENT) - len(head))
    start = _CORPUS.find(" ", int.from_bytes(digest[4:8], "big") % MAX_CONTENT) + 1
    return head + _CORPUS[start : start + size]


def _message(content: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    if calls:
        return {"role": "assistant", "content": None, "tool_calls": calls}
    return {"role": "assistant", "content": content}


def chat_completion(req: ChatRequest, d: Directives, key: str, attempt: int, length: bool,
                    plan_flaw: Callable[[], str | None]) -> dict[str, Any]:
    """The chat.completion body: deterministic content and realistic usage. `plan_flaw` is
    asked (once) for a planning call only: the flaw its plan should have, if any."""
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
    elif req.schema is not None:  # `answer` given: that text, valid for the schema or not
        content = (d.answer if d.answer is not None
                   else structured_answer(req.schema, d.output, req.messages))
    elif req.tools:
        content = sim_tools.final_answer(req.messages)
    elif d.answer_bytes is not None:  # a gateway answering far past max_tokens (a loop)
        content = "x" * d.answer_bytes
    elif d.answer is not None:
        content = d.answer
    elif req.json_mode:
        flaw = plan_flaw()
        content = _plan(_task_of(req), flaw, d.plan_size,
                        sim_tools.offered_to_planner(req.texts),
                        _bound(_MAX_SUBTASKS, req.texts), _bound(_MAX_DEPTH, req.texts))
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


def stream_events(completion: dict[str, Any], include_usage: bool,
                   piece: int = 64) -> list[bytes]:
    """A completion as `chat.completion.chunk` events (OpenAI's streaming shape): the role,
    the content in pieces, the finish reason, the usage when asked for, then [DONE]."""
    choice = completion["choices"][0]
    content: str = choice["message"]["content"]
    head = {"id": completion["id"], "object": "chat.completion.chunk",
            "created": completion["created"], "model": completion["model"]}

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + dumps(chunk) + b"\n\n"

    events = [event({"role": "assistant", "content": ""})]
    events += [event({"content": content[i : i + piece]}) for i in range(0, len(content), piece)]
    events.append(event({}, choice["finish_reason"]))
    if include_usage:
        usage = {**head, "choices": [], "usage": completion["usage"]}
        events.append(b"data: " + dumps(usage) + b"\n\n")
    return [*events, b"data: [DONE]\n\n"]


