"""A worker's call streamed (`stream: true`): its text handed on as it comes, its events put
back together into the completion body a buffered call would have answered.

The caller of the assembled answer sees what it always saw (one body, classified, billed and
retried like any other), so token streaming changes what a reader of the swarm sees and
nothing of how a call is judged. A gateway that answers the streamed request with a plain JSON
body is read as that body; one that refuses it (400, 404, 422) is asked again without `stream`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pydantic_core
from httpx_sse import EventSource, SSEError

from app.gateway.eventstream import DONE, capped
from app.gateway.wire import MAX_ANSWER_BYTES, Answer, WireError, too_large

OnDelta = Callable[[str], None]
# what a gateway answers when it does not stream: the call is asked again as a plain one
REFUSED = frozenset({400, 404, 415, 422})


@dataclass
class Assembly:
    """A completion's chunks, joined: content, tool calls by index, finish, usage."""

    on_delta: OnDelta
    head: dict[str, Any] = field(default_factory=dict)
    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish: str | None = None
    usage: Any = None
    size: int = 0  # characters read: the answer's bound applies to a stream as to a body
    done: bool = False
    limit: int = MAX_ANSWER_BYTES  # the call's answer bound (wire.answer_limit)

    def feed(self, data: str) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise too_large(self.limit)
        if data == DONE:
            self.done = True
            return
        try:
            chunk = pydantic_core.from_json(data)
        except ValueError:
            return  # a comment-like line: nothing of the answer
        if not isinstance(chunk, dict):
            return
        for key in ("id", "model", "created"):
            if key in chunk and key not in self.head:
                self.head[key] = chunk[key]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # one choice is asked for; another's text is not this answer's
            if isinstance(choice.get("finish_reason"), str):
                self.finish = choice["finish_reason"]
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta)

    def _delta(self, delta: dict[str, Any]) -> None:
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.text.append(content)
            self.on_delta(content)
        calls = delta.get("tool_calls")
        for part in calls if isinstance(calls, list) else []:
            if not isinstance(part, dict) or not isinstance(part.get("index", 0), int):
                continue
            call = self.calls.setdefault(part.get("index", 0), {
                "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            if isinstance(part.get("id"), str):
                call["id"] = part["id"]
            function = part.get("function")
            if isinstance(function, dict):
                for key in ("name", "arguments"):
                    if isinstance(function.get(key), str):
                        call["function"][key] += function[key]

    def body(self) -> bytes:
        """The completion a buffered call answers (no `choices` when the stream broke off
        before its finish: read as a truncated answer)."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        out: dict[str, Any] = {"object": "chat.completion", **self.head}
        if self.finish is not None:
            out["choices"] = [{"index": 0, "message": message, "finish_reason": self.finish}]
        if self.usage is not None:
            out["usage"] = self.usage
        return pydantic_core.to_json(out)


async def post_streamed(client: httpx.AsyncClient, url: str, body: bytes,
                        headers: dict[str, str] | None, timeout: float,
                        on_delta: OnDelta, limit: int = MAX_ANSWER_BYTES) -> Answer:
    """One streamed attempt: an error status's body, a plain body, or the stream assembled
    (raises WireError when the connection fails or the answer outgrows its bound)."""
    request = client.build_request("POST", url, content=body, headers=headers,
                                   timeout=httpx.Timeout(timeout))
    try:
        response = await client.send(request, stream=True)
    except httpx.RequestError as exc:
        raise WireError(f"{type(exc).__name__}: {exc}") from exc
    try:
        kind = response.headers.get("content-type", "")
        if not 200 <= response.status_code < 300 or "text/event-stream" not in kind:
            raw = bytearray()
            async for piece in response.aiter_bytes():
                raw += piece
                if len(raw) > limit:
                    raise too_large(limit)
            return Answer(response.status_code, response.headers, bytes(raw))
        assembly = Assembly(on_delta, limit=limit)
        try:
            async for event in EventSource(capped(response)).aiter_sse():
                assembly.feed(event.data)
                if assembly.done:
                    break
        except SSEError as exc:
            raise WireError(f"a broken stream: {exc}", too_large=True) from exc
        except httpx.RequestError as exc:
            raise WireError(f"{type(exc).__name__}: {exc}") from exc
        return Answer(response.status_code, response.headers, assembly.body())
    finally:
        await response.aclose()
