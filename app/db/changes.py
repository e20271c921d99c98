"""What a runner wants durable, handed to the group commit: one SwarmWrite per commit (the
columns its rows carry: app/db/columns.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any


@dataclass(frozen=True, slots=True)
class TenantSettle:
    """A tenant's `Settle` that commits with the ledger row it settles: carried by the swarm's
    write (`SwarmWrite.settles`) into the group commit, applied only if that write is (the
    swarm's lease held), in its transaction (`tenant_cap.settle_tenants`; on
    PostgreSQL `commit_statement`'s settling CTEs)."""

    tenant: str
    reservation_id: str
    day: date
    actual: Decimal

    def row(self, swarm_id: str) -> dict[str, Any]:
        """Its row in the group commit's document (the swarm's id fences it)."""
        return {"swarm_id": swarm_id, "tenant": self.tenant, "id": self.reservation_id,
                "day": self.day, "actual": self.actual}


@dataclass
class SwarmWrite:
    """What one runner wants durable: the swarm's latest totals plus rows, fenced by epoch."""

    swarm_id: str
    epoch: int
    swarm: dict[str, Any]
    subtasks: list[dict[str, Any]] = field(default_factory=list)  # name_, position_, state
    ledger: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    new_subtasks: list[dict[str, Any]] = field(default_factory=list)  # planned, compressors
    webhook: dict[str, Any] | None = None  # the terminal state's delivery, when one is asked
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # the tool ledger
    transcript: list[dict[str, Any]] = field(default_factory=list)  # appended messages
    # tenant caps' settlements of its settled ledger rows: committed with them or not at all
    settles: list[TenantSettle] = field(default_factory=list)
