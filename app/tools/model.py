"""The plain values of the tools package (no MCP import: the SDK loads only when a process has
tool servers configured, since importing it costs seconds of CPU)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.states import ToolCallStatus


@dataclass(frozen=True, slots=True)
class ToolInfo:
    server: str
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a call gave the model: `text` (already cut, `error: …` on failure) and the ledger's
    facts."""

    status: ToolCallStatus
    text: str
    latency_s: float
    result_bytes: int


class ServerUnavailable(Exception):
    """The server is down (not started yet, died, or refused to start)."""
