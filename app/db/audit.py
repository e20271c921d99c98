"""The audit trail (SPEC §16): who changed what, one append-only row per change.

The API binds the request's caller (tenant, key id, request id, client address) in the current
context when it checks the key; a route that changes something then records it with one line
in the transaction of that change, `audit.record(session, "approve", swarm_id)`: the row
commits with the change or not at all. A change that is no database write of its own (a
passthrough call) records in a transaction of its own, `await audit.record_alone(...)`.
"""

from __future__ import annotations

import base64
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, get_args

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.session import SessionFactory
from app.db.tables import AuditRow
from app.db.types import utcnow
from app.schemas import AuditAction

Action = AuditAction
ACTIONS: tuple[str, ...] = get_args(AuditAction)


@dataclass(frozen=True)
class Caller:
    """Who makes the current request: its tenant, its key's id (None with auth off), the
    request's id and the client's address."""

    tenant: str
    key_id: str | None
    request_id: str | None
    client: str | None


_caller: ContextVar[Caller | None] = ContextVar("audit_caller", default=None)


def bind(caller: Caller) -> None:
    _caller.set(caller)


def caller() -> Caller | None:
    return _caller.get()


def key_id() -> str | None:
    """The bound caller's key id (for a trace: never the key)."""
    who = _caller.get()
    return who.key_id if who is not None else None


def row(action: Action, swarm_id: str | None, tenant: str | None = None) -> AuditRow:
    """The row of `action` by the bound caller (a tenant of its own if none is bound: the
    engine's or a command's change)."""
    who = _caller.get()
    return AuditRow(time=utcnow(), tenant=who.tenant if who is not None else tenant or "",
                    key_id=who.key_id if who is not None else None, action=action,
                    swarm_id=swarm_id, request_id=who.request_id if who is not None else None,
                    client=who.client if who is not None else None)


def record(session: AsyncSession, action: Action, swarm_id: str | None = None) -> None:
    """Add the row to the session's transaction: it commits with the change it records."""
    session.add(row(action, swarm_id))


async def record_alone(sessions: SessionFactory, action: Action,
                       swarm_id: str | None = None) -> None:
    """Record in a transaction of its own (a change that writes nothing else first)."""
    async with sessions() as session, session.begin():
        record(session, action, swarm_id)


def statement_values(action: Action) -> tuple[str | None, str, str | None, str | None]:
    """(key id, action, request id, client) for a creation's one statement, which writes its
    audit row itself (app/db/creation_statement.py)."""
    who = _caller.get()
    if who is None:
        return None, action, None, None
    return who.key_id, action, who.request_id, who.client


def encode_cursor(row_id: int) -> str:
    return base64.urlsafe_b64encode(f"a{row_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The id of the last row seen; ValueError when the cursor is not ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith("a"):
            raise ValueError(raw)
        return int(raw[1:])
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("malformed cursor") from exc


async def page(session: AsyncSession, tenant: str, *, since: datetime | None,
               until: datetime | None, action: str | None, limit: int,
               cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """A tenant's rows, newest first: `since` <= time < `until`, of one action; the next
    page's cursor when there is more."""
    query = select(AuditRow).where(AuditRow.tenant == tenant)
    if cursor is not None:
        query = query.where(AuditRow.id < decode_cursor(cursor))
    if since is not None:
        query = query.where(AuditRow.time >= since)
    if until is not None:
        query = query.where(AuditRow.time < until)
    if action is not None:
        query = query.where(AuditRow.action == action)
    rows = list(await session.scalars(query.order_by(AuditRow.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    items = [{"time": r.time, "tenant": r.tenant, "key_id": r.key_id, "action": r.action,
              "swarm_id": r.swarm_id, "request_id": r.request_id, "client": r.client}
             for r in rows]
    return items, (encode_cursor(rows[-1].id) if more and rows else None)
