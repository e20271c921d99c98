"""What a runner wants durable, handed to the group commit: one SwarmWrite per commit (the
columns its rows carry: app/db/columns.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
