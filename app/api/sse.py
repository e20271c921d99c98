"""The event stream's edges: what the OpenAPI document says each event is, and the
`Last-Event-ID` a client resumes after."""

from __future__ import annotations

import re
import signal
from typing import Any

from sse_starlette.sse import AppStatus

from app.errors import ApiError

MAX_EVENT_ID = 2**31 - 1  # events.seq is a 32-bit integer
LAST_EVENT_ID_PATTERN = r"^[0-9]{0,10}$"  # ASCII digits only: int() also takes "٣" and "1_0"
_EVENT_ID = re.compile(LAST_EVENT_ID_PATTERN)
LAST_EVENT_ID_DOC = (f"the `id` of the last event seen, an integer from 0 to {MAX_EVENT_ID}: the "
                     "stream resumes after it (absent or empty: from the first event)")

# SPEC §3, §9 and §14 event names; a schema-aware client checks each event against these
EVENT_NAMES = ("swarm.status", "subtask.started", "subtask.succeeded", "subtask.failed",
               "subtask.skipped", "subtask.turn", "swarm.awaiting_approval", "swarm.completed")


def shutting_down() -> bool:
    """uvicorn was told to exit (SIGTERM, SIGINT): what ends the event streams at once
    (sse-starlette's flag, set by its hook of uvicorn's handler, or the server's own when that
    hook did not take), so a `?wait=` ends too, answered before uvicorn's hard cut (a
    plain-text 500 otherwise)."""
    if AppStatus.should_exit:
        return True
    server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return getattr(server, "should_exit", False) is True


def json_event_schema(data: dict[str, Any], *, done_marker: str | None = None) -> dict[str, Any]:
    """The schema of one parsed SSE event (`event`, `id`, `data`) whose `data` is the JSON text
    of a `data` document (OpenAPI 3.0/3.1 tools read the `schema` of text/event-stream as the
    schema of each event; OpenAPI 3.2 calls it `itemSchema`); `done_marker` is a literal
    `data` that ends the stream (OpenAI's `[DONE]`)."""
    text: dict[str, Any] = {"type": "string", "contentMediaType": "application/json",
                            "contentSchema": data}
    if done_marker is not None:  # not JSON: a branch of its own
        text = {"anyOf": [text, {"type": "string", "const": done_marker}],
                "description": f"JSON text, or `{done_marker}` as the last event"}
    return {"type": "object", "required": ["data"],
            "properties": {"data": text, "event": {"type": "string"},
                           "id": {"type": "string"}, "retry": {"type": "integer"}}}


# One event of GET /swarms/{id}/events: `data` is JSON text, described by contentSchema;
# keep-alive pings are comments, not events.
EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "event", "data"],
    "properties": {
        "id": {"type": "string", "pattern": "^[1-9][0-9]*$",
               "description": "the per-swarm sequence number: consecutive integers from 1"},
        "event": {"type": "string", "enum": list(EVENT_NAMES)},
        "data": {
            "type": "string", "contentMediaType": "application/json",
            "contentSchema": {
                "type": "object", "required": ["seq", "swarm_id"],
                "properties": {"seq": {"type": "integer", "minimum": 1},
                               "swarm_id": {"type": "string", "format": "uuid"}},
                "additionalProperties": True,
            },
            "description": "a JSON object: `seq` (= id), `swarm_id` and the event's fields",
        },
        "retry": {"type": "integer"},
    },
    "example": {"id": "3", "event": "subtask.succeeded",
                "data": '{"seq": 3, "swarm_id": "0b6f…", "name": "code_analyst"}'},
}
# `?deltas=true` on a swarm with `limits.stream_tokens`: a worker's text as it comes, not
# stored, so without `id:` (a resume does not replay it; `subtask.succeeded` has it whole)
DELTA_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "const": "subtask.delta"},
        "data": {
            "type": "string", "contentMediaType": "application/json",
            "contentSchema": {
                "type": "object", "required": ["swarm_id", "name", "text"],
                "properties": {"swarm_id": {"type": "string", "format": "uuid"},
                               "name": {"type": "string"}, "text": {"type": "string"}},
            },
        },
    },
    "example": {"event": "subtask.delta",
                "data": '{"swarm_id": "0b6f…", "name": "code_analyst", "text": "The auth"}'},
}

EVENT_STREAM_RESPONSE: dict[str, Any] = {
    "description": "Server-Sent Events, one per state change; the stream ends after "
                   "`swarm.completed`. While nothing happens a `: ping` comment line comes "
                   "every `SWARM_SSE_PING_S` seconds (15 by default): not an event",
    "content": {"text/event-stream": {"schema": {"anyOf": [EVENT_SCHEMA,
                                                            DELTA_EVENT_SCHEMA]}}},
}


def resume_after(last_event_id: str | None) -> int:
    """The sequence number a stream resumes after (0 without the header). Anything but an
    integer in 0..2^31-1 is a 400 here, not a stream that aborts when the database refuses the
    number."""
    text = (last_event_id or "").strip()
    if not text:
        return 0
    if not _EVENT_ID.fullmatch(text) or int(text) > MAX_EVENT_ID:
        raise ApiError(f"Last-Event-ID must be an integer from 0 to {MAX_EVENT_ID}",
                       code="invalid_last_event_id",
                       details={"field": "Last-Event-ID", "input": text[:64]})
    return int(text)
