"""Crash points for the crash tests: `SWARM_CRASH_AT=<point>:<subtask>` SIGKILLs this process
at that exact moment (points: before_call, after_response, between_turns, after_commit). Unset
in production; the check is one set lookup. The composition root arms it from Settings."""

from __future__ import annotations

import os
import signal

_points: frozenset[tuple[str, str]] = frozenset()


def arm(spec: str) -> None:
    """This process's crash points, from `Settings.crash_at` (empty: none)."""
    global _points
    _points = frozenset(
        (point, subtask)
        for point, _, subtask in (p.partition(":") for p in spec.split(",") if ":" in p)
    )


def crash_point(point: str, subtask: str) -> None:
    """Die like `kill -9` here when the configuration asks for it."""
    if _points and (point, subtask) in _points:
        os.kill(os.getpid(), signal.SIGKILL)
