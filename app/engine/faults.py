"""Crash points for the crash tests: `SWARM_CRASH_AT=<point>:<subtask>` SIGKILLs this process
at that exact moment (points: before_call, after_response, after_commit). Unset in production;
the check is one dict lookup."""

from __future__ import annotations

import os
import signal

_POINTS: frozenset[tuple[str, str]] = frozenset(
    tuple(p.split(":", 1))  # type: ignore[misc]
    for p in os.environ.get("SWARM_CRASH_AT", "").split(",")
    if ":" in p
)


def crash_point(point: str, subtask: str) -> None:
    """Die like `kill -9` here when the environment asks for it."""
    if _POINTS and (point, subtask) in _POINTS:
        os.kill(os.getpid(), signal.SIGKILL)
