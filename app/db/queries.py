"""Reads of swarms, subtasks, events and tool transcripts (the caller owns the transaction),
and the database clock."""

from __future__ import annotations

import base64
import operator
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NamedTuple

from sqlalchemy import (
    Select,
    func,
    or_,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import defer

from app.db.base import table_of
from app.db.tables import Event, Subtask, Swarm, ToolCall, TranscriptMessage
from app.db.tenant_tables import TenantQueue
from app.states import TERMINAL_SWARM, SubtaskKind, SubtaskStatus, SwarmStatus

TERMINAL_VALUES = tuple(s.value for s in TERMINAL_SWARM)

# A swarm is looked up by its id alone and its tenant compared here, not in the statement:
# PostgreSQL plans a prepared statement once and keeps that plan until the tables' statistics
# change (never, without autovacuum), and `id = $1 AND tenant = $2` planned on a new database
# read the tenant's (tenant, status, created_at) index and filtered it by id, every swarm of
# the tenant per lookup as they accumulated (docs/decisions/0009-plans-postgresql-keeps.md).
# By id alone the plan is the primary key's at any size. (A row of another tenant locked
# `for_update` is released with the caller's transaction, which answers 404.)


async def get_swarm(session: AsyncSession, swarm_id: str, tenant: str | None, *,
                    for_update: bool = False) -> Swarm | None:
    """One swarm (of this tenant); `for_update` locks its row for the transaction and reads
    it afresh (a row the session read before may have changed since: an erase)."""
    stmt = select(Swarm).where(Swarm.id == swarm_id)
    if for_update:
        stmt = stmt.with_for_update().execution_options(populate_existing=True)
    swarm = (await session.execute(stmt)).scalar_one_or_none()
    return swarm if swarm is not None and tenant in (None, swarm.tenant) else None


async def recent_twin(session: AsyncSession, tenant: str, digest: str,
                      since: datetime) -> str | None:
    """The newest swarm of `tenant` created since `since` from a body of hash `digest`, its
    content not erased (an SDK retry of an erased swarm runs anew)."""
    stmt = (select(Swarm.id)
            .where(Swarm.tenant == tenant, Swarm.created_at >= since,
                   Swarm.request_hash == digest, Swarm.erased_at.is_(None))
            .order_by(Swarm.created_at.desc()).limit(1))
    return (await session.execute(stmt)).scalar_one_or_none()


async def get_status(session: AsyncSession, swarm_id: str, tenant: str | None
                     ) -> SwarmStatus | None:
    """Just the status (cheap enough to poll)."""
    row = (await session.execute(select(Swarm.status, Swarm.tenant)
                                 .where(Swarm.id == swarm_id))).one_or_none()
    return row[0] if row is not None and tenant in (None, row[1]) else None


async def get_subtasks(session: AsyncSession, swarm_ids: Sequence[str], *,
                       prompts: bool = False, outputs: bool = True
                       ) -> dict[str, list[Subtask]]:
    """Subtasks of each swarm in creation order. Prompts are loaded only for running them
    (no view shows them) and outputs only when asked: a list of 1,000-agent swarms must not
    read every prompt and output back (reading a column left out raises)."""
    out: dict[str, list[Subtask]] = {i: [] for i in swarm_ids}
    if not swarm_ids:
        return out
    left_out = ([] if prompts else [Subtask.system_prompt, Subtask.prompt]) + (
        [] if outputs else [Subtask.output])
    stmt = (
        select(Subtask)
        .where(Subtask.swarm_id.in_(swarm_ids))
        .order_by(Subtask.swarm_id, Subtask.position)
        .options(*(defer(c, raiseload=True) for c in left_out))
    )
    for sub in (await session.execute(stmt)).scalars():
        out[sub.swarm_id].append(sub)
    return out


_SUBTASKS = table_of(Subtask)
# what a view reads of a subtask (SubtaskView), after the swarm to group by


class SubtaskRow(NamedTuple):
    """A subtask as a view reads it (output None where it was not loaded): a tuple's
    attributes cost a tenth of a Row's, read ~20 times per subtask by a view."""

    swarm_id: str
    name: str
    kind: SubtaskKind
    status: SubtaskStatus
    model: str
    depends_on: list[str]
    attempts: int
    truncated: bool
    reused: bool
    sanitized: bool
    error: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: Decimal
    latency_ms: float | None
    started_at: datetime | None
    finished_at: datetime | None
    turns: int
    tool_calls: int
    fallbacks: int
    output_status: str | None
    output_format: str | None
    output: str | None = None
    output_json: Any = None


_OUTPUTS = 2  # the last two fields: left out of lists
_ROW_OF = operator.itemgetter(*SubtaskRow._fields)


def rows_of(subs: Sequence[Subtask]) -> list[SubtaskRow]:
    """Subtask objects as the rows a view reads: one lookup in each one's instance dict, not
    ~20 instrumented reads per subtask; through getattr for one not fully loaded."""
    out: list[SubtaskRow] = []
    for sub in subs:
        try:
            out.append(SubtaskRow._make(_ROW_OF(sub.__dict__)))
        except KeyError:
            out.append(SubtaskRow._make(getattr(sub, f) for f in SubtaskRow._fields))
    return out


async def subtask_views(session: AsyncSession, swarm_ids: Sequence[str], *,
                        outputs: bool = True) -> dict[str, list[SubtaskRow]]:
    """What the views of swarms show of their subtasks, in creation order, read with Core: a
    view only reads them, and loading ORM objects (identity map, instrumented state) costs
    about as much again as the query (docs/decisions/0013-views-without-models.md)."""
    out: dict[str, list[SubtaskRow]] = {i: [] for i in swarm_ids}
    if not swarm_ids:
        return out
    viewed = SubtaskRow._fields if outputs else SubtaskRow._fields[:-_OUTPUTS]
    columns = [_SUBTASKS.c[name] for name in viewed]
    stmt = (select(*columns).where(_SUBTASKS.c.swarm_id.in_(swarm_ids))
            .order_by(_SUBTASKS.c.swarm_id, _SUBTASKS.c.position))
    conn = await session.connection()
    for row in await conn.execute(stmt):
        out[row[0]].append(SubtaskRow(*row))
    return out


async def subtask_output(session: AsyncSession, swarm_id: str, name: str) -> str | None:
    """One subtask's output (None while it has none)."""
    stmt = select(Subtask.output).where(Subtask.swarm_id == swarm_id, Subtask.name == name)
    return (await session.execute(stmt)).scalar_one_or_none()


def _queued_before(swarm: Swarm) -> Select[Any]:
    """The tenant's swarms waiting ahead of this one: queued, older, and claimed by no engine
    (one that is claimed is starting: `tenant_queues` counts the same, migration 0013)."""
    return select(func.count()).where(
        Swarm.tenant == swarm.tenant, Swarm.status == SwarmStatus.queued,
        Swarm.created_at < swarm.created_at, Swarm.lease_owner.is_(None),
    )


async def queue_position(session: AsyncSession, swarm: Swarm) -> int:
    """1 for the tenant's next queued swarm (claims are fair across tenants, oldest first
    within one): counts only the caller's own queue, on the (tenant, status, created_at)
    index; never another tenant's backlog (SPEC §8). Computed when a queued swarm is read;
    a new swarm's comes from its insert (`insert_swarm`: the trigger-kept counts)."""
    count: int = (await session.execute(_queued_before(swarm))).scalar_one()
    return count + 1


async def oldest_queued_at(session: AsyncSession) -> datetime | None:
    """When the oldest swarm of any tenant still waiting to start was created (None: none
    waits); on the (status, lease_expires_at) index."""
    oldest: datetime | None = (await session.execute(
        select(func.min(Swarm.created_at)).where(Swarm.status == SwarmStatus.queued)
    )).scalar_one()
    return oldest


async def queued_swarms(session: AsyncSession, tenant: str) -> int:
    """How many of the tenant's swarms wait in its queue (queued, claimed by no engine), from
    the counts the database's triggers keep (tenant_tables.TenantQueue): one index lookup, whatever
    the backlog."""
    total = (await session.execute(
        select(func.coalesce(func.sum(TenantQueue.queued), 0))
        .where(TenantQueue.tenant == tenant))).scalar_one()
    return int(total)


async def queue_positions(session: AsyncSession, page: Sequence[Swarm],
                          contiguous: bool) -> dict[str, int]:
    """`queue_position` of each queued swarm of one tenant's list page. `contiguous`: the page
    holds every swarm of the tenant between its oldest and newest (keyset paging by creation,
    no filter but the status) — one count then places them all; otherwise one each."""
    queued = sorted((s for s in page if s.status == SwarmStatus.queued),
                    key=lambda s: s.created_at)
    if not queued:
        return {}
    if not contiguous:
        return {s.id: await queue_position(session, s) for s in queued}
    before: int = (await session.execute(_queued_before(queued[0]))).scalar_one()
    waiting = [o for o in queued if o.lease_owner is None]
    return {s.id: before + 1 + sum(o.created_at < s.created_at for o in waiting)
            for s in queued}


def encode_cursor(swarm: Swarm) -> str:
    raw = f"{swarm.created_at.isoformat()}|{swarm.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """(created_at, id) of the last item seen; ValueError when the cursor is not ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, _, swarm_id = raw.partition("|")
        when = datetime.fromisoformat(created)
        if when.tzinfo is None:
            raise ValueError("naive timestamp")
        # in UTC, as stored: an offset at the calendar's edge (0001-01-01T00:00+14:00) has no
        # UTC instant, and an id that is not a UUID (a NUL byte, say) is refused by PostgreSQL
        when = when.astimezone(UTC)
        uuid.UUID(swarm_id)
    except (ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise ValueError("malformed cursor") from exc
    return when, swarm_id


async def list_swarms(
    session: AsyncSession, tenant: str, status: str | None, limit: int, cursor: str | None,
    retry_of: str | None = None,
) -> tuple[list[Swarm], str | None]:
    """Newest first, keyset-paged by (created_at, id); optionally only the retries of a swarm."""
    stmt = select(Swarm).where(Swarm.tenant == tenant)
    if status is not None:
        stmt = stmt.where(Swarm.status == status)
    if retry_of is not None:
        stmt = stmt.where(Swarm.retry_of == retry_of)
    if cursor is not None:
        when, last_id = decode_cursor(cursor)
        stmt = stmt.where(
            or_(Swarm.created_at < when, (Swarm.created_at == when) & (Swarm.id < last_id))
        )
    stmt = stmt.order_by(Swarm.created_at.desc(), Swarm.id.desc()).limit(limit + 1)
    rows = list((await session.execute(stmt)).scalars())
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (encode_cursor(rows[-1]) if more and rows else None)


async def events_after(
    session: AsyncSession, swarm_id: str, after_seq: int, limit: int = 500
) -> list[Event]:
    stmt = (
        select(Event)
        .where(Event.swarm_id == swarm_id, Event.seq > after_seq)
        .order_by(Event.seq)
        .limit(limit)
    )
    return list((await session.execute(stmt)).scalars())





async def get_transcript(session: AsyncSession, swarm_id: str,
                         subtask_name: str) -> list[TranscriptMessage]:
    """The committed messages of one subtask, in order."""
    stmt = (select(TranscriptMessage)
            .where(TranscriptMessage.swarm_id == swarm_id,
                   TranscriptMessage.subtask_name == subtask_name)
            .order_by(TranscriptMessage.seq))
    return list((await session.execute(stmt)).scalars())


async def get_subtask(session: AsyncSession, swarm_id: str, name: str) -> Subtask | None:
    stmt = select(Subtask).where(Subtask.swarm_id == swarm_id, Subtask.name == name)
    return (await session.execute(stmt)).scalar_one_or_none()


async def get_tool_calls(session: AsyncSession, swarm_id: str) -> list[ToolCall]:
    """The tool ledger of a swarm, in commit order."""
    stmt = select(ToolCall).where(ToolCall.swarm_id == swarm_id).order_by(ToolCall.id)
    return list((await session.execute(stmt)).scalars())
