"""Errors of the /v1 routes in OpenAI's shape, `{"error": {"message", "type", "param",
"code"}}`, with the statuses of SPEC §3, so the OpenAI SDKs raise their own error classes.

Decided for the facade (docs/OPENAI.md): 400 when the body cannot be understood (not JSON, an
unknown `agent_swarm` key, a parameter a swarm cannot honour), 422 when it is understood but a
value is invalid (wrong type or range, a model without a price) — as on `POST /swarms`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.deps import KeyFirstRoute
from app.api.errors import (
    UNPARSED_MESSAGE,
    _field,
    as_api_error,
    body_unparsed,
    database_refusal,
)
from app.errors import ApiError, Refused, openai_error_body
from app.openai_schemas import OpenAIError

log = logging.getLogger(__name__)

DESCRIPTIONS = {
    400: "the body is not JSON, has an unknown `agent_swarm` key or a parameter a swarm "
         "cannot honour",
    401: "missing, wrong or expired API key",
    403: "the key lacks the scope `chat` (insufficient_scope); or a client off loopback, or a "
         "Host that is not loopback's, while the API has no keys "
         "(SWARM_API_KEYS)",
    409: "the swarm was cancelled",
    413: "request body too large",
    415: "a compressed body (Content-Encoding) or one that is not JSON (Content-Type)",
    422: "a value is invalid (type, range, a model without a price)",
    429: "a quota, the daily cap, or the gateway's rate limit (see Retry-After)",
    502: "the swarm failed, the gateway refused our credentials, or its answer could not be "
         "relayed",
    503: "the gateway or the database is unavailable, the swarm did not finish in time, or "
         "every gateway slot of the process stayed taken"}


def openai_error(status: int, message: str, code: str | None = None, param: str | None = None,
                 *, swarm_id: str | None = None, headers: dict[str, str] | None = None,
                 retry: bool | None = None) -> JSONResponse:
    """The error answer. `retry=False` adds `x-should-retry: false`, which the OpenAI SDKs obey:
    retrying a request that ran a swarm would run (and pay for) another one."""
    answer = openai_error_body(status, message, code, param)
    if swarm_id is not None:
        answer["error"]["swarm_id"] = swarm_id
    out = dict(headers or {})
    if retry is not None:
        out["x-should-retry"] = "true" if retry else "false"
    return JSONResponse(answer, status_code=status, headers=out)


# one answer each status may give, as the facade writes it (the document's examples)
_EXAMPLES: dict[int, tuple[str, str | None, str | None]] = {  # message, code, param
    400: ("the request body is not valid JSON", "invalid_json", None),
    401: ("invalid API key", "unauthorized", None),
    403: ("this API has no SWARM_API_KEYS: it serves loopback clients only", "forbidden", None),
    409: ("swarm 0b6f1c2e-8d1a-4a57-9c3e-2f7d9e6b1a44 cancelled", "swarm_cancelled", None),
    413: ("request body over 10485760 bytes", "payload_too_large", None),
    415: ("request bodies must be JSON: send Content-Type: application/json (got 'text/plain')",
          "unsupported_media_type", None),
    422: ("messages: Field required", "validation_error", "messages"),
    429: ("the daily budget cannot cover this call: it needs up to 1.5 USD", "quota_exceeded",
          None),
    502: ("swarm 0b6f1c2e-8d1a-4a57-9c3e-2f7d9e6b1a44 failed: 3 of 4 subtasks failed",
          "failure_tolerance_exceeded", None),
    503: ("the gateway is unavailable", "gateway_unavailable", None),
}


def openai_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries documenting OpenAI's error shape for these statuses, each
    with an example answer."""
    out: dict[int | str, dict[str, Any]] = {}
    for s in statuses:
        out[s] = {"model": OpenAIError, "description": DESCRIPTIONS.get(s, "error")}
        if s in _EXAMPLES:
            out[s]["content"] = {"application/json": {"example": openai_error_body(
                s, *_EXAMPLES[s])}}
    return out


def seconds_to_midnight() -> int:
    """Retry-After for a spent daily cap: the next UTC day."""
    now = datetime.now(UTC)
    midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), UTC)
    return max(math.ceil((midnight - now).total_seconds()), 1)


def _param(details: Any) -> str | None:
    if isinstance(details, dict) and isinstance(details.get("field"), str):
        return str(details["field"])
    if isinstance(details, list) and details and isinstance(details[0], dict):
        field = details[0].get("field")
        return field if isinstance(field, str) else None
    return None


def _validation(exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return openai_error(400, "the request body is not valid JSON", "invalid_json")
    unknown = [e for e in errors if e.get("type") == "extra_forbidden"]
    if unknown:
        field = _field(tuple(unknown[0].get("loc", ())))
        return openai_error(400, f"unknown parameter {field}", "unknown_parameter", field)
    first = errors[0] if errors else {}
    field = _field(tuple(first.get("loc", ())))
    return openai_error(422, f"{field}: {first.get('msg', 'invalid request')}",
                        "validation_error", field)


def _api_error(exc: ApiError) -> JSONResponse:
    headers = dict(getattr(exc, "headers", None) or {})
    retry_after = getattr(exc, "retry_after_s", None)  # a quota's 429 (SPEC §8)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    if exc.status_code == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return openai_error(exc.status_code, exc.message, exc.code, _param(exc.details),
                        headers=headers)


class OpenAIRoute(KeyFirstRoute):
    """A route whose errors, validation included (and the key's, checked first), are
    rendered in OpenAI's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return _validation(exc)
            except ApiError as exc:
                return _api_error(exc)
            except Refused as exc:
                return _api_error(as_api_error(exc))
            except StarletteHTTPException as exc:
                if body_unparsed(exc):
                    return openai_error(400, UNPARSED_MESSAGE, "invalid_json")
                return openai_error(exc.status_code, str(exc.detail), None,
                                    headers=dict(exc.headers or {}))
            except Exception as exc:
                refusal = database_refusal(exc)
                if refusal is not None:
                    return openai_error(503, refusal[0], "unavailable", headers=refusal[1])
                log.error("unhandled error", exc_info=exc)
                return openai_error(500, "internal error", "internal")

        return route
