"""The errors a gateway call raises: refused (not retried) or unavailable (retries ran out)."""

from __future__ import annotations

from app.gateway.chat import AttemptRecord, Outcome


class GatewayError(Exception):
    """A call that did not succeed; carries every attempt made."""

    def __init__(self, message: str, attempts: tuple[AttemptRecord, ...]) -> None:
        super().__init__(message)
        self.attempts = attempts
        last = attempts[-1] if attempts else None
        self.status_code: int | None = last.status_code if last else None
        # No attempt at all only happens when the deadline had already passed.
        self.outcome: Outcome = last.outcome if last else Outcome.timeout


class GatewayRejected(GatewayError):
    """The gateway refused the request (a non-retryable 4xx); retrying would not help."""


class GatewayUnavailable(GatewayError):
    """Retryable failures until max_attempts or the deadline ran out."""

    def __init__(
        self, message: str, attempts: tuple[AttemptRecord, ...], *, deadline_hit: bool
    ) -> None:
        super().__init__(message, attempts)
        self.deadline_hit = deadline_hit
