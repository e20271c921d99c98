"""A route FastAPI documents but does not parse: for `POST /swarms`, where FastAPI's
dependency solver was a large share of `serve`'s CPU under a creation load
(docs/decisions/0008-post-swarms-parsed-by-hand.md).

The endpoint keeps its annotated signature, so the OpenAPI document is generated from it as
for any route; its requests go through `parse` (request → the endpoint's keyword arguments)
instead. `json_body` and `header` answer what FastAPI answers for the same input, errors
included (tests/perf/test_request_parser.py sends every case to both).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, cast

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.exceptions import HTTPException

from app.api.errors import BODY_UNPARSED
from app.middleware import is_json_type

Parse = Callable[[Request], Awaitable[dict[str, Any]]]
T = TypeVar("T")


def parsed_route(parse: Parse) -> type[APIRoute]:
    """An APIRoute class whose requests `parse` turns into the endpoint's arguments."""

    class HandParsedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            endpoint = cast(Callable[..., Coroutine[Any, Any, Response]], self.endpoint)

            async def handle(request: Request) -> Response:
                return await endpoint(**await parse(request))

            return handle

    return HandParsedRoute


def _located(exc: ValidationError, *prefix: str | int) -> list[dict[str, Any]]:
    return [{**e, "loc": (*prefix, *e["loc"])} for e in exc.errors(include_url=False)]


async def json_body(request: Request, adapter: TypeAdapter[T],
                    errors: list[dict[str, Any]]) -> T | None:
    """The request's JSON body validated by `adapter`, or None with `errors` extended (a
    body that is not JSON raises: 400 as FastAPI answers it)."""
    raw = await request.body()
    if not raw:
        errors.append({"type": "missing", "loc": ("body",), "msg": "Field required",
                       "input": None})
        return None
    value: Any = raw  # not declared JSON: validated as bytes, i.e. refused
    content_type = request.headers.get("content-type")
    if content_type and is_json_type(content_type):  # else refused first (BodyLimit: 415)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RequestValidationError(
                [{"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
                  "input": {}, "ctx": {"error": exc.msg}}], body=exc.doc) from exc
        except Exception as exc:  # not UTF-8, nested past the recursion limit
            raise HTTPException(400, BODY_UNPARSED) from exc
    try:
        return adapter.validate_python(value, from_attributes=True)
    except ValidationError as exc:
        errors.extend(_located(exc, "body"))
        return None


def header(request: Request, name: str, adapter: TypeAdapter[T],
           errors: list[dict[str, Any]]) -> T | None:
    """The header `name` validated by `adapter` (None when absent), or None with `errors`
    extended."""
    value = request.headers.get(name)
    if value is None:
        return None
    try:
        return adapter.validate_python(value, from_attributes=True)
    except ValidationError as exc:
        errors.extend(_located(exc, "header", name))
        return None
