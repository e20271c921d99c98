"""The copy behind `POST /swarms/{id}/retry`: a new swarm whose subtasks are the old swarm's,
those that succeeded kept (`reused`, with their outputs) and the others reset to `pending`.

One INSERT … SELECT copies every subtask inside the database (outputs never travel through
Python, no ORM object per row), one executemany writes the new swarm's first events. The old
swarm's rows are only read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    String,
    Table,
    case,
    false,
    insert,
    literal,
    null,
    select,
    true,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.columns import SUBTASK_DEFINITION, SUBTASK_KEPT, SUBTASK_RUN, default_of
from app.db.create import insert_swarm
from app.db.tables import Event, Subtask, Swarm
from app.db.types import UTCDateTime
from app.states import SubtaskKind, SubtaskStatus

_SUBTASKS = cast(Table, Subtask.__table__)
_EVENTS = cast(Table, Event.__table__)


@dataclass(frozen=True, slots=True)
class Reused:
    """A subtask copied as succeeded into the new swarm."""

    name: str
    kind: str


def _reusable(t: Table) -> ColumnElement[bool]:
    # the synthesis always runs again: the results it merges may differ this time
    return (t.c.status == SubtaskStatus.succeeded) & (t.c.kind != SubtaskKind.synthesizer)


def _copied(t: Table) -> ColumnElement[bool]:
    # a compressor that did not succeed is left behind: the engine makes one again if needed
    return (t.c.kind != SubtaskKind.compressor) | (t.c.status == SubtaskStatus.succeeded)


def copy_columns(new_id: str, now: datetime) -> dict[str, ColumnElement[Any]]:
    """Every column of the new swarm's subtask rows (but the key) as an expression over the
    old row: the definition copied, the outcome kept only for a reused subtask."""
    t = _SUBTASKS
    ok = _reusable(t)

    def if_kept(value: ColumnElement[Any], otherwise: ColumnElement[Any]) -> ColumnElement[Any]:
        return case((ok, value), else_=otherwise)

    return {
        "swarm_id": literal(new_id, String(36)),
        # a kept subtask shows the model that answered; one run again starts at its first
        # (`_first_models`)
        **{c: t.c[c] for c in SUBTASK_DEFINITION},
        **{c: if_kept(t.c[c], default_of(c)) for c in SUBTASK_KEPT},
        "status": if_kept(literal(SubtaskStatus.succeeded.value, String(16)),
                          literal(SubtaskStatus.pending.value, String(16))),
        "finished_at": if_kept(literal(now, UTCDateTime()), null()),
        "reused": if_kept(true(), false()),
        # no call in this swarm: no attempts, tokens, cost, latency or tool use of its own
        **{c: default_of(c) for c in SUBTASK_RUN},
    }


async def rerun_models(session: AsyncSession, old_id: str) -> list[str]:
    """The models of the subtasks a retry of `old_id` would call again (fallbacks too)."""
    t = _SUBTASKS
    rows = await session.execute(
        select(t.c.model, t.c.models)
        .where(t.c.swarm_id == old_id, _copied(t), ~_reusable(t)))
    return sorted({name for model, models in rows for name in (models or [model])})


async def _first_models(session: AsyncSession, old_id: str, new_id: str) -> None:
    """A subtask run again that had fallen back starts at its first model again (the one
    that was down may be up by now): the few such rows set one by one."""
    t = _SUBTASKS
    fell_back = (await session.execute(
        select(t.c.name, t.c.models)
        .where(t.c.swarm_id == old_id, t.c.fallbacks > 0, _copied(t), ~_reusable(t)))).all()
    for name, models in fell_back:
        await session.execute(update(t).where(t.c.swarm_id == new_id, t.c.name == name)
                              .values(model=models[0]))


async def copy_swarm(session: AsyncSession, old_id: str, new: Swarm) -> list[Reused]:
    """Insert `new` (queued, `retry_of` set) with a copy of `old_id`'s subtasks and one
    `subtask.succeeded` event (`reused: true`) per kept subtask, in the caller's transaction."""
    t = _SUBTASKS
    ok = _reusable(t)
    kept = (await session.execute(
        select(t.c.name, t.c.kind, t.c.truncated, t.c.sanitized)
        .where(t.c.swarm_id == old_id, ok).order_by(t.c.position))).all()
    now: datetime = new.created_at
    new.event_seq = len(kept)
    await insert_swarm(session, new, [])

    columns = copy_columns(new.id, now)
    await session.execute(
        insert(t).from_select(
            list(columns), select(*columns.values()).where(t.c.swarm_id == old_id, _copied(t))))
    await _first_models(session, old_id, new.id)
    if kept:
        await session.execute(insert(_EVENTS), [
            {"swarm_id": new.id, "seq": i, "type": "subtask.succeeded", "created_at": now,
             "data": {"name": r.name, "kind": r.kind, "latency_ms": None,
                      "truncated": bool(r.truncated), "sanitized": bool(r.sanitized),
                      "reused": True}}
            for i, r in enumerate(kept, start=1)])
    return [Reused(r.name, r.kind) for r in kept]


async def retried_by(session: AsyncSession, swarm_ids: Sequence[str]) -> dict[str, str]:
    """{swarm id: its newest retry} for those of `swarm_ids` that were retried."""
    if not swarm_ids:
        return {}
    rows = await session.execute(
        select(Swarm.retry_of, Swarm.id).where(Swarm.retry_of.in_(list(swarm_ids)))
        .order_by(Swarm.created_at, Swarm.id))
    return {old: new for old, new in rows if old is not None}
