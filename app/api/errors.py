"""Every error answered in the SPEC's shape: `{"error": {"code", "message", "details"}}`."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.db.retry import database_not_migrated, database_unavailable, reason
from app.errors import (
    ApiError,
    Refused,
    RequestInvalid,
    TooManyRequests,
    error_body,
    is_openai_path,
    openai_error_body,
)
from app.middleware import CatchAll, head_served
from app.schemas import ErrorResponse
from app.states import SwarmStatus

log = logging.getLogger(__name__)

_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 413: "payload_too_large",
               415: "unsupported_media_type", 429: "too_many_requests", 503: "unavailable"}


def error_response(status: int, code: str, message: str, details: Any = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def _jsonable(value: Any, limit: int = 200) -> Any:
    """The offending input, echoed: scalars as they are, anything else (and long strings) as a
    short string (a missing field's input is the whole body)."""
    if value is None or isinstance(value, (int, float, bool)):
        return value
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "…"


async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "invalid_json", "the request body is not valid JSON",
                              [{"field": "body", "message": str(e.get("msg"))} for e in errors])
    details = [
        {"field": _field(tuple(e.get("loc", ()))), "message": str(e.get("msg")),
         "type": str(e.get("type")), "input": _jsonable(e.get("input"))}
        for e in errors
    ]
    first = details[0] if details else {"field": "body", "message": "invalid request"}
    return error_response(422, "validation_error", f"{first['field']}: {first['message']}",
                          details)


async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
    if isinstance(exc, TooManyRequests):
        headers = exc.headers
    return error_response(exc.status_code, exc.code, exc.message, exc.details, headers)


def as_api_error(exc: Refused) -> ApiError:
    """A domain refusal as the API answers it: 422 with its SPEC code."""
    return RequestInvalid(exc.message, code=exc.code, details=exc.details)


async def _refused(request: Request, exc: Refused) -> JSONResponse:
    return await _api_error(request, as_api_error(exc))


# FastAPI's (and json_body's) answer to a body json.loads raised on other than a syntax
# error: not UTF-8, nested past the recursion limit, an integer of over 4,300 digits
BODY_UNPARSED = "There was an error parsing the body"
UNPARSED_MESSAGE = "the request body is not valid JSON (not UTF-8, nested too deep, or a number "\
                   "too long)"


def body_unparsed(exc: StarletteHTTPException) -> bool:
    return exc.status_code == 400 and exc.detail == BODY_UNPARSED


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The router's own errors (no route, a method the path does not serve), in the shape of
    the path's API: OpenAI's on /v1, so an OpenAI SDK reads `POST /v1/models`' answer too."""
    if body_unparsed(exc):
        if is_openai_path(request.url.path):
            return JSONResponse(openai_error_body(400, UNPARSED_MESSAGE, "invalid_json"),
                                status_code=400)
        return error_response(400, "invalid_json", UNPARSED_MESSAGE,
                              [{"field": "body", "message": UNPARSED_MESSAGE}])
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    headers = dict(exc.headers) if exc.headers else None
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": allowed_methods(request)}
    if is_openai_path(request.url.path):
        return JSONResponse(openai_error_body(exc.status_code, str(exc.detail), code),
                            status_code=exc.status_code, headers=headers)
    return error_response(exc.status_code, code, str(exc.detail), None, headers)


def allowed_methods(request: Request) -> str:
    """Every method the path answers (RFC 9110 §15.5.6), each tried against the routes:
    Starlette's 405 names only the first route that matched the path, so `OPTIONS /swarms`
    said `Allow: POST` where GET is served too. HEAD wherever GET is (`HeadAsGet`)."""
    # a path the document names literally is that route's (`/swarms/estimate`), not a value
    # of another's parameter (`/swarms/{swarm_id}`)
    literal = request.app.openapi().get("paths", {}).get(request.url.path)
    if literal is not None:
        allowed = {m.upper() for m in literal if m.upper() in _METHODS}
    else:
        routes = request.app.router.routes
        allowed = {m for m in _METHODS if any(
            route.matches({**request.scope, "method": m})[0] == Match.FULL for route in routes)}
    if "GET" in allowed and head_served(request.url.path):
        allowed.add("HEAD")
    return ", ".join(m for m in _METHODS if m in allowed)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def database_refusal(exc: Exception) -> tuple[str, dict[str, str]] | None:
    """The 503's message and headers (logged here, once) when `exc` is the database's state,
    not the request's: unreachable, its pool with no connection to give, or not migrated yet
    (a `serve` started before `swarm-api migrate`); None for anything else."""
    if database_unavailable(exc):  # pool timeouts included
        log.warning("database unavailable: %s", reason(exc))
        return "the database is unavailable; retry shortly", {"Retry-After": "1"}
    if database_not_migrated(exc):
        log.warning("database not migrated (run `swarm-api migrate`): %s", type(exc).__name__)
        return "the database is not migrated; its operator must run `swarm-api migrate`", {}
    return None


async def unhandled(exc: Exception) -> JSONResponse:
    """The answer to an exception no handler took, logged here once: 503 for the database's
    state (`database_refusal`), else 500."""
    refusal = database_refusal(exc)
    if refusal is not None:
        return error_response(503, "unavailable", refusal[0], None, refusal[1])
    log.error("unhandled error", exc_info=exc)
    return error_response(500, "internal", "internal error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(Refused, _refused)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
    # innermost of the middleware added by create_app, so the HTTP metrics see its status
    app.add_middleware(CatchAll, render=unhandled)


# one answer each status may give, as the API writes it (the OpenAPI document's examples)
_EXAMPLES: dict[int, tuple[str, str, Any]] = {
    400: ("invalid_json", "the request body is not valid JSON",
          [{"field": "body", "message": "JSON decode error"}]),
    401: ("unauthorized", "missing bearer token", None),
    403: ("forbidden", "this API has no SWARM_API_KEYS: it serves loopback clients only (set "
          "SWARM_API_KEYS, or SWARM_ALLOW_OPEN=1)", None),
    404: ("not_found", "no swarm 0b6f1c2e-8d1a-4a57-9c3e-2f7d9e6b1a44",
          {"id": "0b6f1c2e-8d1a-4a57-9c3e-2f7d9e6b1a44"}),
    409: ("already_terminal", "swarm is already succeeded",
          {"status": SwarmStatus.succeeded.value}),
    413: ("payload_too_large", "request body over 10485760 bytes", {"limit": 10485760}),
    415: ("unsupported_media_type", "request bodies must be JSON: send Content-Type: "
          "application/json (got 'application/x-www-form-urlencoded')",
          {"content_type": "application/x-www-form-urlencoded"}),
    422: ("validation_error", "limits.concurrency: Input should be greater than or equal to 1",
          [{"field": "limits.concurrency", "type": "greater_than_equal", "input": 0,
            "message": "Input should be greater than or equal to 1"}]),
    429: ("quota_exceeded", "2 swarms active; the limit is 2",
          {"limit": "max_active_swarms", "max": 2, "count": 2}),
    503: ("unavailable", "the database is unavailable; retry shortly", None),
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries documenting the error shape for these statuses, each with
    an example answer."""
    out: dict[int | str, dict[str, Any]] = {}
    for s in statuses:
        out[s] = {"model": ErrorResponse, "description": _HTTP_CODES.get(s, "error")}
        if s in _EXAMPLES:
            out[s]["content"] = {"application/json": {"example": error_body(*_EXAMPLES[s])}}
    return out
