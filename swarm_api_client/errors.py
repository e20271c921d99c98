"""Typed errors: each carries the SPEC error code, the HTTP status and the error's details."""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx

MAX_TEXT = 300  # characters of a non-JSON error body kept in the message


class SwarmApiError(Exception):
    """Any error of the Swarm API: `code` is the SPEC's `error.code` (e.g. `not_found`)."""

    def __init__(self, message: str, *, code: str, status_code: int | None = None,
                 details: Any = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status_code = status_code
        self.details = details
        self.retry_after = retry_after

    def __str__(self) -> str:
        status = f"{self.status_code} " if self.status_code is not None else ""
        return f"{status}{self.code}: {self.message}"


class ConnectionFailed(SwarmApiError):
    """The service could not be reached (refused, reset, timed out), retries included."""


class WaitTimeout(SwarmApiError, TimeoutError):
    """`wait` gave up: the swarm was not terminal within the timeout."""


class BadRequest(SwarmApiError):
    """400: e.g. `invalid_json`."""


class Unauthorized(SwarmApiError):
    """401: the API key is missing or refused."""


class Forbidden(SwarmApiError):
    """403."""


class NotFound(SwarmApiError):
    """404 `not_found`: no such swarm for this tenant."""


class Conflict(SwarmApiError):
    """409: `already_terminal` (cancel), `not_retryable` or `swarm_erased` (retry),
    `not_terminal` (erase)."""


class PayloadTooLarge(SwarmApiError):
    """413 `payload_too_large`."""


class InvalidRequest(SwarmApiError):
    """422: `validation_error`, `unknown_model`, `idempotency_key_reused`, …"""


class RateLimited(SwarmApiError):
    """429 `rate_limited` / `quota_exceeded`; `retry_after` in seconds when the server said."""


class Unavailable(SwarmApiError):
    """503 (the database or the service is unavailable) and other 5xx answers."""


_BY_STATUS: dict[int, type[SwarmApiError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
    413: PayloadTooLarge, 422: InvalidRequest, 429: RateLimited,
}


def retry_after(response: httpx.Response) -> float | None:
    """`Retry-After` in seconds (a number or an HTTP date), or None when absent or unreadable."""
    raw = response.headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def error_from_response(response: httpx.Response) -> SwarmApiError:
    """The typed error for a non-2xx answer; reads the SPEC shape, tolerates any other body."""
    status = response.status_code
    code, message, details = f"http_{status}", response.reason_phrase or "error", None
    try:
        body = response.json()
    except ValueError:
        body = None
        text = response.text.strip()
        if text:
            message = text[:MAX_TEXT]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = str(err.get("code") or code)
        message = str(err.get("message") or message)
        details = err.get("details")
    cls = _BY_STATUS.get(status, Unavailable if status >= 500 else SwarmApiError)
    return cls(message, code=code, status_code=status, details=details,
               retry_after=retry_after(response))
