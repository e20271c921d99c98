"""Errors with SPEC error codes: domain refusals (no HTTP in them: the engine and the webhook
policy raise them, the API layer maps them) and the API's own, which carry their status."""

from __future__ import annotations

import math
from typing import Any


def json_safe(value: Any) -> Any:
    """What JSON can carry of an echoed input: NaN/Infinity as strings, lone surrogates
    replaced (a bad request must not turn into a 500 while its error is rendered)."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode()
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {json_safe(str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    """The SPEC's error answer, `{"error": {"code", "message", "details"}}` (every route but
    the OpenAI-compatible /v1 ones), safe to encode as JSON."""
    return {"error": {"code": code, "message": json_safe(message), "details": json_safe(details)}}


OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                409: "conflict_error", 413: "invalid_request_error", 415: "invalid_request_error",
                422: "invalid_request_error", 429: "rate_limit_error"}


def openai_error_body(status: int, message: str, code: str | None = None,
                      param: str | None = None) -> dict[str, Any]:
    """OpenAI's error answer, `{"error": {"message", "type", "param", "code"}}`, for the /v1
    routes (their SDKs raise their own error classes from it), safe to encode as JSON."""
    return {"error": {"message": json_safe(message),
                      "type": OPENAI_TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def is_openai_path(path: str) -> bool:
    """The OpenAI-compatible routes, which answer every error in OpenAI's shape."""
    return path.startswith("/v1/")


class Refused(Exception):
    """A request the domain refuses — a swarm spec the engine cannot run (an unknown model, a
    cycle, an unknown tool, too many agents), a webhook URL the policy forbids: a SPEC code,
    a message and details. The API answers it 422 (app/api/errors.py)."""

    def __init__(self, message: str, *, code: str, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details


class ApiError(Exception):
    """An error the API answers as `{"error": {"code", "message", "details"}}`."""

    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, *, details: Any = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        if code is not None:
            self.code = code


class RequestInvalid(ApiError):
    status_code = 422
    code = "validation_error"


class SwarmNotFound(ApiError):
    status_code = 404
    code = "not_found"

    @classmethod
    def of(cls, swarm_id: str) -> SwarmNotFound:
        """No swarm `swarm_id` (or not the caller's: the same answer)."""
        return cls(f"no swarm {swarm_id}", details={"id": swarm_id})


class AlreadyTerminal(ApiError):
    status_code = 409
    code = "already_terminal"


class NotRetryable(ApiError):
    status_code = 409
    code = "not_retryable"


class NotTerminal(ApiError):
    """An erase of a swarm that has not ended (SPEC §16)."""

    status_code = 409
    code = "not_terminal"


class SwarmErased(ApiError):
    """A retry of a swarm whose content was erased: nothing is left to run again."""

    status_code = 409
    code = "swarm_erased"


class NotAwaitingApproval(ApiError):
    status_code = 409
    code = "not_awaiting_approval"


class IdempotencyKeyReused(ApiError):
    status_code = 422
    code = "idempotency_key_reused"


class Unauthorized(ApiError):
    status_code = 401
    code = "unauthorized"


class Forbidden(ApiError):
    """403: a valid key without the scope the route needs (`insufficient_scope`)."""

    status_code = 403
    code = "forbidden"


class TooManyRequests(ApiError):
    """429 with `Retry-After`: `rate_limited` (the tenant's bucket is empty) or
    `quota_exceeded` (a count or the daily cap; `details.limit` names the key)."""

    status_code = 429
    code = "quota_exceeded"

    def __init__(self, message: str, *, limit: str, retry_after_s: float,
                 code: str = "quota_exceeded", **details: object) -> None:
        super().__init__(message, details={"limit": limit, **details}, code=code)
        self.limit = limit
        self.retry_after_s = max(int(-(-retry_after_s // 1)), 1)  # whole seconds, rounded up

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}
