"""Repository functions: they take a session, never commit; the caller owns the transaction."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Float,
    Select,
    String,
    Table,
    Update,
    bindparam,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import defer
from sqlalchemy.sql import Executable, Insert

from app.db.notify import CHANGED, QUEUED, notify
from app.db.session import is_postgres as _is_pg
from app.db.tables import (
    Event,
    GatewayCall,
    Subtask,
    Swarm,
    ToolCall,
    TranscriptMessage,
    Webhook,
)
from app.db.types import utcnow
from app.states import TERMINAL_SWARM, SwarmStatus

ACTIVE = (SwarmStatus.planning, SwarmStatus.running, SwarmStatus.synthesizing)
TERMINAL_VALUES = tuple(s.value for s in TERMINAL_SWARM)


class LeaseLost(Exception):
    """This process no longer owns the swarm: another took it over, or it was released."""


async def db_now(session: AsyncSession) -> datetime:
    """Database time on Postgres (leases never trust worker clocks); local time on SQLite,
    which runs in this one process."""
    if _is_pg(session):
        value: datetime = (await session.execute(select(func.now()))).scalar_one()
        return value
    return utcnow()


# ---- creation and reads ------------------------------------------------------------------


SUBTASK_INSERT_COLUMNS = (
    "swarm_id", "name", "position", "kind", "model", "depends_on", "system_prompt", "prompt",
    "max_tokens", "temperature", "weight", "status", "attempts", "output", "error", "truncated",
    "prompt_tokens", "completion_tokens", "cost_usd", "latency_ms", "ready_at", "started_at",
    "finished_at", "reused", "tools", "max_turns", "turns", "tool_calls",
    "sanitized",
)


def insert_row(sub: Subtask) -> dict[str, Any]:
    """Every column of a new subtask, for Core executemany inserts."""
    return {c: getattr(sub, c) for c in SUBTASK_INSERT_COLUMNS}


_SWARMS = cast(Table, Swarm.__table__)
# (attribute, column key) of every mapped column of a swarm row
_SWARM_COLUMNS = tuple((p.key, p.columns[0].key) for p in sa_inspect(Swarm).column_attrs)
_LEASED = ("lease_owner", "lease_epoch", "lease_expires_at")


def _swarm_values(swarm: Swarm) -> dict[str, Any]:
    """Every column of a new swarm: its attributes, else the column's default (else NULL)."""
    state = swarm.__dict__
    values: dict[str, Any] = {}
    for attr, col in _SWARM_COLUMNS:
        if attr in state:
            values[col] = state[attr]
        else:
            default: Any = _SWARMS.c[col].default
            values[col] = (None if default is None else default.arg if default.is_scalar
                           else default.arg(None))
    return values


_PG_INSERTS: dict[tuple[bool, bool], Executable] = {}


def _pg_insert_swarm(claim: bool, count: bool) -> Executable:
    """One statement: the swarm's row (leased with `claim`: lease from the database's clock,
    `:lease_s` ahead), its NOTIFY, and with `count` the tenant's queued swarms older than it
    (the statement's snapshot: the new row is not counted). Built once per shape, with bind
    parameters only, so SQLAlchemy's compiled cache serves every request."""
    key = (claim, count)
    if key not in _PG_INSERTS:
        cols: dict[str, Any] = {c: bindparam(c, type_=_SWARMS.c[c].type)
                                for _, c in _SWARM_COLUMNS}
        if claim:
            cols["lease_expires_at"] = func.now() + func.make_interval(
                0, 0, 0, 0, 0, 0, bindparam("lease_s", type_=Float()))
        new = (pg_insert(_SWARMS).values(cols)
               .returning(_SWARMS.c.lease_expires_at).cte("new_swarm"))
        out: list[Any] = [func.pg_notify(QUEUED, bindparam("id_", type_=String())),
                          new.c.lease_expires_at]
        if count:
            out.append(select(func.count()).where(
                _SWARMS.c.tenant == bindparam("tenant"),
                _SWARMS.c.status == SwarmStatus.queued.value,
                _SWARMS.c.created_at < bindparam("created_at")).scalar_subquery())
        _PG_INSERTS[key] = select(*out).select_from(new)
    return _PG_INSERTS[key]


async def insert_swarm(session: AsyncSession, swarm: Swarm, subtasks: Sequence[Subtask], *,
                       claim_for: str | None = None, lease_s: float = 0.0,
                       position: bool = False) -> int | None:
    """Insert a queued swarm and its subtasks, and wake the workers (on commit).

    Core statements, no unit of work: on PostgreSQL the swarm's row, its NOTIFY and (with
    `position`) its queue position are one statement, the subtasks a second. `claim_for`
    leases the new swarm to that engine in the same statement (`claim_new`'s epoch 1, its
    lease from the database's clock), and its queue position is then 1: it starts now, no
    swarm of its tenant's queue ahead of it. Returns the queue position when asked."""
    if claim_for is not None:
        swarm.lease_owner, swarm.lease_epoch = claim_for, 1
    values = _swarm_values(swarm)
    count = position and claim_for is None
    found: int | None = 1 if position else None
    if _is_pg(session):
        stmt = _pg_insert_swarm(claim_for is not None, count)
        params = {**values, "id_": swarm.id}
        if claim_for is not None:
            del params["lease_expires_at"]
            params["lease_s"] = float(lease_s)
        row = (await session.execute(stmt, params)).one()
        swarm.lease_expires_at = row[1]
        if count:
            found = int(row[2]) + 1
    else:
        if claim_for is not None:
            values["lease_expires_at"] = utcnow() + timedelta(seconds=lease_s)
            swarm.lease_expires_at = values["lease_expires_at"]
        await session.execute(insert(_SWARMS), values)
        if count:
            found = await queue_position(session, swarm)
    if subtasks:  # executemany: a hundred ORM objects cost a unit of work each
        await session.execute(_SUBTASK_INSERT, [insert_row(s) for s in subtasks])
    return found


async def expire_idempotency_key(session: AsyncSession, tenant: str, key: str,
                                 ttl_s: float) -> None:
    """Free a key older than its TTL so it can name a new swarm (the old swarm keeps its data)."""
    cutoff = await db_now(session) - timedelta(seconds=ttl_s)
    await session.execute(
        update(Swarm)
        .where(Swarm.tenant == tenant, Swarm.idempotency_key == key, Swarm.created_at < cutoff)
        .values(idempotency_key=None, request_hash=None)
    )


async def find_by_idempotency_key(session: AsyncSession, tenant: str, key: str,
                                  ttl_s: float) -> Swarm | None:
    """The swarm a live (not yet expired) Idempotency-Key names."""
    cutoff = await db_now(session) - timedelta(seconds=ttl_s)
    stmt = select(Swarm).where(Swarm.tenant == tenant, Swarm.idempotency_key == key,
                               Swarm.created_at >= cutoff)
    return (await session.execute(stmt)).scalar_one_or_none()


async def get_swarm(session: AsyncSession, swarm_id: str, tenant: str | None, *,
                    for_update: bool = False) -> Swarm | None:
    """One swarm (of this tenant); `for_update` locks its row for the transaction."""
    stmt = select(Swarm).where(Swarm.id == swarm_id)
    if for_update:
        stmt = stmt.with_for_update()
    if tenant is not None:
        stmt = stmt.where(Swarm.tenant == tenant)
    return (await session.execute(stmt)).scalar_one_or_none()


async def get_status(session: AsyncSession, swarm_id: str, tenant: str | None
                     ) -> SwarmStatus | None:
    """Just the status (cheap enough to poll)."""
    stmt = select(Swarm.status).where(Swarm.id == swarm_id)
    if tenant is not None:
        stmt = stmt.where(Swarm.tenant == tenant)
    return (await session.execute(stmt)).scalar_one_or_none()


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


async def subtask_output(session: AsyncSession, swarm_id: str, name: str) -> str | None:
    """One subtask's output (None while it has none)."""
    stmt = select(Subtask.output).where(Subtask.swarm_id == swarm_id, Subtask.name == name)
    return (await session.execute(stmt)).scalar_one_or_none()


def _queued_before(swarm: Swarm) -> Select[Any]:
    return select(func.count()).where(
        Swarm.tenant == swarm.tenant, Swarm.status == SwarmStatus.queued,
        Swarm.created_at < swarm.created_at,
    )


async def queue_position(session: AsyncSession, swarm: Swarm) -> int:
    """1 for the tenant's next queued swarm (claims are fair across tenants, oldest first
    within one): counts only the caller's own queue, on the (tenant, status, created_at)
    index; never another tenant's backlog (SPEC §8). Computed when a queued swarm is read;
    a new swarm's comes from its insert (`insert_swarm`)."""
    count: int = (await session.execute(_queued_before(swarm))).scalar_one()
    return count + 1


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


# ---- claims and leases -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claim:
    swarm_id: str
    epoch: int
    rescues: int


def _idle_ms(seconds: float) -> str:
    return str(max(int(seconds * 1000), 1))


def _idle_limit(seconds: float) -> ColumnElement[str]:
    """`set_config` of this transaction's idle_in_transaction_session_timeout (PostgreSQL),
    selected by each statement that locks swarm rows, in the same round trip.

    A process paused (SIGSTOP, a frozen VM) inside a transaction that locked a swarm row keeps
    the lock, and claims skip locked rows: nobody could take the swarm over while it stays
    paused. Bounded by the lease, PostgreSQL ends such a transaction (ours are never idle for
    more than milliseconds; a process silent for a lease may be taken over anyway). A statement
    that returns no row locked nothing, so it needs no bound."""
    return func.set_config("idle_in_transaction_session_timeout", _idle_ms(seconds), True)


def _claimable(now: Any) -> ColumnElement[bool]:
    # a just-claimed swarm is still `queued` until its runner commits: the lease guards it too
    return Swarm.status.in_((SwarmStatus.queued, *ACTIVE)) & or_(
        Swarm.lease_expires_at.is_(None), Swarm.lease_expires_at < now)


# Fair claims (SPEC §8): round-robin across tenants. A claimable swarm's priority is its
# tenant's swarms held now (live leases) + its rank in its tenant's queue (oldest = 1): the
# oldest swarm of the tenant with the fewest running goes first, and one tenant's backlog
# delays another's swarm by at most one claim per free slot. Ties: oldest first.
_PG_CLAIM = text("""
WITH held AS (
    SELECT tenant, count(*) AS n FROM swarms
    WHERE status IN ('queued', 'planning', 'running', 'synthesizing')
      AND lease_expires_at >= now()
    GROUP BY tenant
),
ranked AS (
    SELECT c.id, c.created_at,
           COALESCE(h.n, 0)
             + row_number() OVER (PARTITION BY c.tenant ORDER BY c.created_at, c.id) AS prio
    FROM swarms c LEFT JOIN held h ON h.tenant = c.tenant
    WHERE c.status IN ('queued', 'planning', 'running', 'synthesizing')
      AND (c.lease_expires_at IS NULL OR c.lease_expires_at < now())
      AND c.id <> ALL(CAST(:exclude AS text[]))
),
picked AS MATERIALIZED (
    SELECT s.id FROM swarms s JOIN ranked r ON r.id = s.id
    WHERE s.status IN ('queued', 'planning', 'running', 'synthesizing')
      AND (s.lease_expires_at IS NULL OR s.lease_expires_at < now())
    ORDER BY r.prio, r.created_at, r.id
    LIMIT :limit
    FOR UPDATE OF s SKIP LOCKED
)
UPDATE swarms AS s
SET lease_owner = :owner,
    lease_expires_at = now() + make_interval(secs => :lease),
    lease_epoch = s.lease_epoch + 1,
    rescues = s.rescues + CASE WHEN s.lease_owner IS NOT NULL THEN 1 ELSE 0 END
FROM picked WHERE s.id = picked.id
RETURNING s.id, s.lease_epoch, s.rescues,
          set_config('idle_in_transaction_session_timeout', :idle_ms, true)
""")


async def claim_swarms(
    session: AsyncSession, owner: str, lease_s: float, limit: int,
    exclude: Sequence[str] = (),
) -> list[Claim]:
    """Take up to `limit` queued or abandoned swarms, fairly across tenants (see _PG_CLAIM),
    with a fresh lease epoch.

    `exclude`: the swarms this process still drives. Their leases may have run out while the
    database was unreachable; the heartbeat takes them back, a claim would fence out their
    own runner (and count a rescue)."""
    if limit <= 0:
        return []
    if _is_pg(session):
        rows = await session.execute(
            _PG_CLAIM, {"owner": owner, "lease": float(lease_s), "limit": limit,
                        "exclude": list(exclude), "idle_ms": _idle_ms(lease_s)}
        )
        return [Claim(r[0], r[1], r[2]) for r in rows]
    now = utcnow()
    ids = list((await session.execute(_fair_order(now, exclude, limit))).scalars())
    claims: list[Claim] = []
    for swarm_id in ids:
        row = (await session.execute(
            update(Swarm)
            .where(Swarm.id == swarm_id, _claimable(now))
            .values(
                lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_s),
                lease_epoch=Swarm.lease_epoch + 1,
                # an owner that never released it died with it (release clears the owner)
                rescues=Swarm.rescues + func.iif(Swarm.lease_owner.is_not(None), 1, 0),
            )
            .returning(Swarm.id, Swarm.lease_epoch, Swarm.rescues)
        )).one_or_none()
        if row is not None:
            claims.append(Claim(row[0], row[1], row[2]))
    return claims


def _fair_order(now: datetime, exclude: Sequence[str], limit: int) -> Select[tuple[str]]:
    """_PG_CLAIM's order in Core (SQLite: one process, so no row locks to skip)."""
    held = (select(Swarm.tenant, func.count().label("n"))
            .where(Swarm.status.in_((SwarmStatus.queued, *ACTIVE)),
                   Swarm.lease_expires_at >= now)
            .group_by(Swarm.tenant).subquery())
    rank = func.row_number().over(partition_by=Swarm.tenant,
                                  order_by=(Swarm.created_at, Swarm.id))
    ranked = (select(Swarm.id, Swarm.created_at,
                     (func.coalesce(held.c.n, 0) + rank).label("prio"))
              .outerjoin(held, held.c.tenant == Swarm.tenant)
              .where(_claimable(now), Swarm.id.not_in(list(exclude))).subquery())
    return (select(ranked.c.id)
            .order_by(ranked.c.prio, ranked.c.created_at, ranked.c.id).limit(limit))


async def claim_new(session: AsyncSession, swarm_id: str, owner: str, lease_s: float) -> int:
    """Lease a swarm inserted in this same transaction to this process; its epoch."""
    now = await db_now(session)
    epoch: int = (await session.execute(
        update(Swarm)
        .where(Swarm.id == swarm_id)
        .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_s),
                lease_epoch=Swarm.lease_epoch + 1)
        .returning(Swarm.lease_epoch)
    )).scalar_one()
    return epoch


async def extend_leases(
    session: AsyncSession, owner: str, epochs: dict[str, int], lease_s: float
) -> dict[str, bool]:
    """Extend the leases this process still holds: {swarm id: cancel requested}; a swarm
    missing from the answer was lost."""
    if not epochs:
        return {}
    now = await db_now(session)
    bound = [_idle_limit(lease_s)] if _is_pg(session) else []
    rows = await session.execute(
        update(Swarm)
        .where(Swarm.id.in_(list(epochs)), Swarm.lease_owner == owner)
        .values(lease_expires_at=now + timedelta(seconds=lease_s))
        .returning(Swarm.id, Swarm.lease_epoch, Swarm.cancel_requested, *bound)
    )
    return {r[0]: bool(r[2]) for r in rows if epochs.get(r[0]) == r[1]}


async def release_leases(session: AsyncSession, owner: str, swarm_ids: Sequence[str]) -> None:
    """Give swarms back at once (graceful shutdown) so another process continues them: idle
    workers are woken (on commit) instead of finding them at their next poll."""
    if swarm_ids:
        rows = await session.execute(
            update(Swarm)
            .where(Swarm.id.in_(list(swarm_ids)), Swarm.lease_owner == owner)
            .values(lease_owner=None, lease_expires_at=None)
            .returning(Swarm.id)
        )
        await notify(session, QUEUED, list(rows.scalars()))


async def load_swarms_for_run(session: AsyncSession, swarm_ids: Sequence[str]
                              ) -> dict[str, tuple[Swarm, list[Subtask]]]:
    """Several claimed swarms with their subtasks in two queries (a burst of claims must not
    cost two round trips per swarm before the first one starts)."""
    if not swarm_ids:
        return {}
    swarms = (await session.execute(select(Swarm).where(Swarm.id.in_(list(swarm_ids))))).scalars()
    subs = await get_subtasks(session, swarm_ids, prompts=True)
    return {s.id: (s, subs[s.id]) for s in swarms}


# ---- the group commit --------------------------------------------------------------------


@dataclass
class SwarmWrite:
    """What one runner wants durable: the swarm's latest totals plus rows, fenced by epoch."""

    swarm_id: str
    epoch: int
    swarm: dict[str, Any]
    subtasks: list[dict[str, Any]] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    new_subtasks: list[dict[str, Any]] = field(default_factory=list)  # planned, compressors
    webhook: dict[str, Any] | None = None  # the terminal state's delivery, when one is asked
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # the tool ledger
    transcript: list[dict[str, Any]] = field(default_factory=list)  # appended messages


async def lock_leases(session: AsyncSession, swarm_ids: Sequence[str],
                      lease_s: float | None = None) -> dict[str, tuple[int, str | None]]:
    """Lock the swarms' rows (`SELECT … FOR UPDATE`: holds off a concurrent claim until this
    transaction ends) and return {id: (lease_epoch, lease_owner)}. With `lease_s`, a pause of
    this process inside the transaction cannot hold the rows locked for longer."""
    lock = (
        select(Swarm.id, Swarm.lease_epoch, Swarm.lease_owner)
        .where(Swarm.id.in_(list(swarm_ids)))
        .with_for_update()
    )
    if lease_s is not None and _is_pg(session):
        lock = lock.add_columns(_idle_limit(lease_s))  # in the same round trip as the lock
    return {r[0]: (r[1], r[2]) for r in await session.execute(lock)}


async def apply_writes(session: AsyncSession, owner: str, writes: Sequence[SwarmWrite],
                       lease_s: float | None = None) -> set[str]:
    """Write many runners' changes in one transaction; returns the swarm ids fenced out
    (another process holds their lease now), whose writes were dropped."""
    held = await lock_leases(session, list({w.swarm_id for w in writes}), lease_s)
    ok = [w for w in writes if held.get(w.swarm_id) == (w.epoch, owner)]
    fenced = {w.swarm_id for w in writes} - {w.swarm_id for w in ok}
    if not ok:
        return fenced
    latest: dict[str, dict[str, Any]] = {}
    inserts: list[dict[str, Any]] = []
    hooks: list[dict[str, Any]] = []
    subtasks: list[dict[str, Any]] = []
    ledger: dict[tuple[str, int], dict[str, Any]] = {}
    events: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    transcript: list[dict[str, Any]] = []
    for w in ok:
        latest[w.swarm_id] = {"id_": w.swarm_id, **w.swarm}
        inserts.extend(w.new_subtasks)
        if w.webhook is not None:
            hooks.append(w.webhook)
        subtasks.extend({"swarm_id_": w.swarm_id, **row} for row in w.subtasks)
        for row in w.ledger:  # an attempt written ahead and settled in one batch: one row
            ledger[(row["idempotency_key"], row["attempt"])] = row
        events.extend(w.events)
        tool_calls.extend(w.tool_calls)
        transcript.extend(w.transcript)
    # Core executemany: the ORM's bulk paths cost several times more per row (measured)
    conn = await session.connection()
    await conn.execute(_SWARM_UPDATE, list(latest.values()))
    if inserts:
        await conn.execute(_ignoring_duplicates(conn, _SUBTASK_INSERT), inserts)
    if subtasks:
        await conn.execute(_SUBTASK_UPDATE, subtasks)
    if ledger:
        await conn.execute(settling_insert(conn), list(ledger.values()))
    if events:
        await conn.execute(_ignoring_duplicates(conn, _EVENT_INSERT), events)
    if hooks:
        await conn.execute(_ignoring_duplicates(conn, _WEBHOOK_INSERT), hooks)
    if tool_calls:
        await conn.execute(_ignoring_duplicates(conn, _TOOL_CALL_INSERT), tool_calls)
    if transcript:
        await conn.execute(_ignoring_duplicates(conn, _TRANSCRIPT_INSERT), transcript)
    await notify(session, CHANGED, list(latest))
    return fenced


SWARM_TOTAL_COLUMNS = ("spent_usd", "reserved_usd", "unresolved_usd", "prompt_tokens",
                       "completion_tokens", "gateway_calls")


async def apply_spend_only(session: AsyncSession, owner: str, write: SwarmWrite,
                           lease_s: float | None = None) -> bool:
    """The money of a write that cannot be stored whole (its text is refused): only its
    ledger rows and the swarm's totals, which hold nothing but our own names and numbers.
    False when fenced out."""
    held = await lock_leases(session, [write.swarm_id], lease_s)
    if held.get(write.swarm_id) != (write.epoch, owner):
        return False
    await session.execute(update(Swarm).where(Swarm.id == write.swarm_id).values(
        {c: write.swarm[c] for c in SWARM_TOTAL_COLUMNS if c in write.swarm}))
    if write.ledger:
        conn = await session.connection()
        rows = {(r["idempotency_key"], r["attempt"]): r for r in write.ledger}
        await conn.execute(settling_insert(conn), list(rows.values()))
    return True


def _ignoring_duplicates(conn: AsyncConnection, stmt: Insert) -> Executable:
    """INSERT … ON CONFLICT DO NOTHING: a batch retried after a lost COMMIT outcome inserts
    nothing twice (events are unique by seq)."""
    dialect = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    return dialect(stmt.table).on_conflict_do_nothing()


_LEDGER_SETTLED = ("http_status", "outcome", "prompt_tokens", "completion_tokens",
                   "cached_tokens", "cost_usd", "latency_ms")


def settling_insert(conn: AsyncConnection) -> Executable:
    """Ledger rows by (idempotency_key, attempt): a new row is inserted (an attempt written
    ahead as `in_flight`), an `in_flight` one is settled by its answer, a settled one is never
    touched again (so a batch retried after a lost COMMIT outcome changes nothing, and a
    write-ahead never un-settles a row)."""
    table = cast(Table, GatewayCall.__table__)
    stmt = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(table)
    return stmt.on_conflict_do_update(
        index_elements=["idempotency_key", "attempt"],
        set_={c: stmt.excluded[c] for c in _LEDGER_SETTLED},
        where=table.c.outcome == "in_flight",
    )


def _update_by_key(table: Table, key: Sequence[str], columns: Sequence[str]) -> Update:
    """UPDATE table SET col = :col, ... WHERE key = :key_, for executemany with dict rows."""
    return (
        update(table)
        .where(*(table.c[k] == bindparam(f"{k}_") for k in key))
        .values({c: bindparam(c) for c in columns})
    )


SWARM_STATE_COLUMNS = (
    *SWARM_TOTAL_COLUMNS, "status", "result", "error", "started_at", "finished_at",
    "event_seq",
)
SUBTASK_STATE_COLUMNS = (
    "status", "attempts", "output", "error", "truncated", "sanitized", "prompt_tokens",
    "completion_tokens", "cost_usd", "latency_ms", "ready_at", "started_at", "finished_at",
    "turns", "tool_calls",
)
_SWARM_UPDATE = _update_by_key(cast(Table, Swarm.__table__), ["id"], SWARM_STATE_COLUMNS)
_SUBTASK_UPDATE = _update_by_key(
    cast(Table, Subtask.__table__), ["swarm_id", "name"], SUBTASK_STATE_COLUMNS)
_SUBTASK_INSERT = insert(cast(Table, Subtask.__table__))
_EVENT_INSERT = insert(cast(Table, Event.__table__))
_WEBHOOK_INSERT = insert(cast(Table, Webhook.__table__))
_TOOL_CALL_INSERT = insert(cast(Table, ToolCall.__table__))
_TRANSCRIPT_INSERT = insert(cast(Table, TranscriptMessage.__table__))


# ---- tools -----------------------------------------------------------------------------------


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
