"""What every metered gateway attempt has, a swarm's (`calls.CallMeter`) or a caller's passed
through (`passthrough.PassthroughMeter`): its ledger row, and the outcome that row moves
through (`states.ATTEMPT_TRANSITIONS`). Each meter numbers its attempts and holds its own
reservations; the metrics of a billed attempt are `metrics.count_attempt`."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from app.db.types import utcnow
from app.gateway.chat import Usage
from app.states import AttemptOutcome, InvalidTransition, attempt_transition


@dataclass
class AttemptState:
    """The latest attempt's ledger outcome: `in_flight` from when its row is numbered until
    it is settled once (by its answer, `unknown` or `cancelled`); None before the first."""

    outcome: AttemptOutcome | None = None

    @property
    def in_flight(self) -> bool:
        return self.outcome is AttemptOutcome.in_flight

    def open(self) -> None:
        """The next attempt is numbered: its row starts `in_flight`."""
        self.outcome = AttemptOutcome.in_flight

    def settle(self, outcome: AttemptOutcome) -> None:
        """The open attempt's row settles: once, from `in_flight` (else InvalidTransition)."""
        if self.outcome is None:
            raise InvalidTransition(f"attempt none -> {outcome}")
        self.outcome = attempt_transition(self.outcome, outcome)

    def withdraw(self) -> None:
        """The attempt just numbered never had its row written: as if never opened."""
        self.outcome = None


@dataclass(frozen=True, slots=True)
class AttemptRows:
    """The ledger rows of one logical call's attempts, from what they all share."""

    swarm_id: str | None  # None: a passthrough call, of no swarm
    tenant: str
    subtask_name: str | None
    model: str
    key: str  # the call's Idempotency-Key, the same across its attempts
    reserved: Decimal  # the worst case each attempt reserves

    def row(self, attempt: int, outcome: AttemptOutcome, status: int | None, u: Usage,
            cost: Decimal, latency_s: float, at_bound: bool = False) -> dict[str, Any]:
        """Attempt `attempt`'s row (an `owned_swarm.LedgerRow`); `at_bound`: its cost is an upper
        bound, not a usage reported (`unresolved_usd`)."""
        return {
            "swarm_id": self.swarm_id, "tenant": self.tenant, "subtask_name": self.subtask_name,
            "model": self.model, "idempotency_key": self.key, "attempt": attempt,
            "http_status": status, "outcome": outcome,
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "cached_tokens": u.cached_tokens, "cost_usd": cost, "reserved_usd": self.reserved,
            "at_bound": at_bound, "latency_ms": round(latency_s * 1000, 3),
            "created_at": utcnow(),
        }
