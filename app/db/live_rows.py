"""Live rows: a swarm's and its subtasks' rows as the engine holds them while it runs the
swarm, plain attributes where the mapped classes' are instrumented; and `SubtaskView`, what a
reader of a subtask (stored or live) may read."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from sqlalchemy import inspect as sa_inspect

from app.db.base import Base, column_values
from app.db.tables import Subtask, Swarm
from app.states import SubtaskKind, SubtaskStatus


class _Unfilled:
    """A column of a live row (below) that was never filled: reading it is a bug, said so,
    not a silent None."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        raise AttributeError(f"{type(obj).__name__}.{self.key} was never filled")


class LiveSwarm(Swarm):
    """A swarm's row as the engine holds it while it runs the swarm: the same attributes,
    typed alike, but plain ones. An instrumented read costs ~25 times a plain one and a write
    ~60 times (attribute events, history), and the engine makes ~150 per subtask: live rows
    take a fifth to a quarter off `serve`'s CPU per subtask.
    A live row never joins a session: its changes reach the database as dicts
    (`column_values`) in the runner's writes. Unmapped (`__abstract__`)."""

    __abstract__ = True


class LiveSubtask(Subtask):
    """A subtask's row as the engine holds it (see LiveSwarm)."""

    __abstract__ = True


def _plain(live: type[Base], mapped: type[Base]) -> tuple[str, ...]:
    keys = tuple(p.key for p in sa_inspect(mapped).column_attrs)
    for key in keys:  # shadows the instrumented attribute: the instance dict answers first
        setattr(live, key, _Unfilled(key))
    return keys


_SWARM_KEYS = _plain(LiveSwarm, Swarm)
_SUBTASK_KEYS = _plain(LiveSubtask, Subtask)


def live_swarm(row: Swarm) -> LiveSwarm:
    """A loaded (or new) swarm row as a live one, every column filled: from the instance dict
    where loaded, else through getattr (a new row's unset column reads None)."""
    if isinstance(row, LiveSwarm):
        return row
    return _filled(LiveSwarm, column_values(row, _SWARM_KEYS))


def live_subtask(row: Subtask) -> LiveSubtask:
    """A loaded subtask row as a live one (see live_swarm)."""
    if isinstance(row, LiveSubtask):
        return row
    return _filled(LiveSubtask, column_values(row, _SUBTASK_KEYS))


def new_live_swarm(**columns: Any) -> LiveSwarm:
    """A new live swarm from every column (an instrumented `Swarm(...)` cost ~50 µs, ~4 % of
    a 1-agent `POST /swarms`)."""
    return _filled(LiveSwarm, columns)


def new_live_subtask(**columns: Any) -> LiveSubtask:
    """A new live subtask from every column but its id (assigned when it is inserted)."""
    return _filled(LiveSubtask, columns)


_Live = TypeVar("_Live", LiveSwarm, LiveSubtask)


def _filled(kind: type[_Live], columns: dict[str, Any]) -> _Live:
    live: _Live = object.__new__(kind)
    live.__dict__.update(columns)
    return live


class SubtaskView(Protocol):
    """What a view of a subtask reads (app/views.py): a Subtask, or a `queries.SubtaskRow`."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> SubtaskKind: ...
    @property
    def status(self) -> SubtaskStatus: ...
    @property
    def model(self) -> str: ...
    @property
    def depends_on(self) -> list[str]: ...
    @property
    def attempts(self) -> int: ...
    @property
    def output(self) -> str | None: ...
    @property
    def truncated(self) -> bool: ...
    @property
    def reused(self) -> bool: ...
    @property
    def sanitized(self) -> bool: ...
    @property
    def error(self) -> dict[str, Any] | None: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def cost_usd(self) -> Decimal: ...
    @property
    def latency_ms(self) -> float | None: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def finished_at(self) -> datetime | None: ...
    @property
    def turns(self) -> int: ...
    @property
    def tool_calls(self) -> int: ...
    @property
    def fallbacks(self) -> int: ...
    @property
    def output_status(self) -> str | None: ...
    @property
    def output_format(self) -> str | None: ...
    @property
    def output_json(self) -> Any: ...
