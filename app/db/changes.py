"""What a runner wants durable, handed to the group commit: one SwarmWrite per commit, and
the columns its rows carry."""

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


SWARM_TOTAL_COLUMNS = ("spent_usd", "reserved_usd", "unresolved_usd", "prompt_tokens",
                       "completion_tokens", "gateway_calls")
SWARM_STATE_COLUMNS = (
    *SWARM_TOTAL_COLUMNS, "status", "result", "error", "started_at", "finished_at",
    "event_seq", "vote",
)
SUBTASK_STATE_COLUMNS = (
    "status", "attempts", "output", "error", "truncated", "sanitized", "prompt_tokens",
    "completion_tokens", "cost_usd", "latency_ms", "ready_at", "started_at", "finished_at",
    "turns", "tool_calls", "model", "fallbacks", "output_json", "output_status",
    "output_format",
)
# what an answer settles of an attempt written ahead (its model too: the one it was sent to)
LEDGER_SETTLED = ("model", "http_status", "outcome", "prompt_tokens", "completion_tokens",
                   "cached_tokens", "cost_usd", "at_bound", "latency_ms")
