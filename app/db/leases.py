"""Who runs a swarm: claims (fair across tenants), local adoption, heartbeats extending
leases, release, and loading claimed swarms. Leases use the database clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    case,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.notify import QUEUED, notify
from app.db.queries import get_subtasks
from app.db.session import db_now
from app.db.session import is_postgres as _is_pg
from app.db.tables import Subtask, Swarm
from app.db.types import utcnow
from app.states import CLAIMABLE_SWARM, sql_in


class LeaseLost(Exception):
    """This process no longer owns the swarm: another took it over, or it was released."""




@dataclass(frozen=True, slots=True)
class Claim:
    swarm_id: str
    epoch: int
    rescues: int
    # taken from another owner: `lease_expired` (it held the lease and went silent) or
    # `released` (it gave the swarm back, shutting down); None for a first claim
    takeover: str | None = None


def _takeover(had_owner: bool, previous_epoch: int) -> str | None:
    if had_owner:
        return "lease_expired"
    return "released" if previous_epoch > 0 else None


def idle_ms(seconds: float) -> str:
    return str(max(int(seconds * 1000), 1))


def idle_limit(seconds: float) -> ColumnElement[str]:
    """`set_config` of this transaction's idle_in_transaction_session_timeout (PostgreSQL),
    selected by each statement that locks swarm rows, in the same round trip.

    A process paused (SIGSTOP, a frozen VM) inside a transaction that locked a swarm row keeps
    the lock, and claims skip locked rows: nobody could take the swarm over while it stays
    paused. Bounded by the lease, PostgreSQL ends such a transaction (ours are never idle for
    more than milliseconds; a process silent for a lease may be taken over anyway). A statement
    that returns no row locked nothing, so it needs no bound."""
    return func.set_config("idle_in_transaction_session_timeout", idle_ms(seconds), True)


def _claimable(now: Any) -> ColumnElement[bool]:
    # a just-claimed swarm is still `queued` until its runner commits: the lease guards it too
    return Swarm.status.in_(CLAIMABLE_SWARM) & or_(
        Swarm.lease_expires_at.is_(None), Swarm.lease_expires_at < now)


_CLAIMABLE = sql_in(CLAIMABLE_SWARM)
# Fair claims (SPEC §8): round-robin across tenants. A claimable swarm's priority is its
# tenant's swarms held now (live leases) + its rank in its tenant's queue (oldest = 1): the
# oldest swarm of the tenant with the fewest running goes first, and one tenant's backlog
# delays another's swarm by at most one claim per free slot. Ties: oldest first.
_PG_CLAIM = text(f"""
WITH held AS (
    SELECT tenant, count(*) AS n FROM swarms
    WHERE status IN ({_CLAIMABLE})
      AND lease_expires_at >= now()
    GROUP BY tenant
),
ranked AS (
    SELECT c.id, c.created_at,
           COALESCE(h.n, 0)
             + row_number() OVER (PARTITION BY c.tenant ORDER BY c.created_at, c.id) AS prio
    FROM swarms c LEFT JOIN held h ON h.tenant = c.tenant
    WHERE c.status IN ({_CLAIMABLE})
      AND (c.lease_expires_at IS NULL OR c.lease_expires_at < now())
      AND c.id <> ALL(CAST(:exclude AS text[]))
),
picked AS MATERIALIZED (
    SELECT s.id, s.lease_owner IS NOT NULL AS had_owner, s.lease_epoch AS previous_epoch
    FROM swarms s JOIN ranked r ON r.id = s.id
    WHERE s.status IN ({_CLAIMABLE})
      AND (s.lease_expires_at IS NULL OR s.lease_expires_at < now())
    ORDER BY r.prio, r.created_at, r.id
    LIMIT :limit
    FOR UPDATE OF s SKIP LOCKED
)
UPDATE swarms AS s
SET lease_owner = :owner,
    lease_expires_at = now() + make_interval(secs => :lease),
    lease_epoch = s.lease_epoch + 1,
    rescues = CASE WHEN s.settled_epoch >= s.lease_epoch THEN 0
                   WHEN s.lease_owner IS NOT NULL THEN s.rescues + 1 ELSE s.rescues END
FROM picked WHERE s.id = picked.id
RETURNING s.id, s.lease_epoch, s.rescues,
          set_config('idle_in_transaction_session_timeout', :idle_ms, true),
          picked.had_owner, picked.previous_epoch
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
                        "exclude": list(exclude), "idle_ms": idle_ms(lease_s)}
        )
        return [Claim(r[0], r[1], r[2], _takeover(r[4], r[5])) for r in rows]
    now = utcnow()
    picked = (await session.execute(_fair_order(now, exclude, limit))).all()
    claims: list[Claim] = []
    for swarm_id, had_owner, previous_epoch in picked:
        row = (await session.execute(
            update(Swarm)
            .where(Swarm.id == swarm_id, _claimable(now))
            .values(
                lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_s),
                lease_epoch=Swarm.lease_epoch + 1,
                rescues=_rescues(),
            )
            .returning(Swarm.id, Swarm.lease_epoch, Swarm.rescues)
        )).one_or_none()
        if row is not None:
            claims.append(Claim(row[0], row[1], row[2], _takeover(had_owner, previous_epoch)))
    return claims


def _rescues() -> ColumnElement[int]:
    """The consecutive fruitless takeovers after this claim (_PG_CLAIM's alike): a call
    settled in the epoch this claim ends resets them; an owner that never released the swarm
    died with it (release clears the owner), a fruitless takeover; a release counts nothing."""
    return case((Swarm.settled_epoch >= Swarm.lease_epoch, 0),
                (Swarm.lease_owner.is_not(None), Swarm.rescues + 1), else_=Swarm.rescues)


def _fair_order(now: datetime, exclude: Sequence[str], limit: int
                ) -> Select[str, bool, int]:
    """_PG_CLAIM's order in Core (SQLite: one process, so no row locks to skip)."""
    held = (select(Swarm.tenant, func.count().label("n"))
            .where(Swarm.status.in_(CLAIMABLE_SWARM),
                   Swarm.lease_expires_at >= now)
            .group_by(Swarm.tenant).subquery())
    rank = func.row_number().over(partition_by=Swarm.tenant,
                                  order_by=(Swarm.created_at, Swarm.id))
    ranked = (select(Swarm.id, Swarm.created_at,
                     (func.coalesce(held.c.n, 0) + rank).label("prio"),
                     Swarm.lease_owner.is_not(None).label("had_owner"),
                     Swarm.lease_epoch.label("previous_epoch"))
              .outerjoin(held, held.c.tenant == Swarm.tenant)
              .where(_claimable(now), Swarm.id.not_in(list(exclude))).subquery())
    return (select(ranked.c.id, ranked.c.had_owner, ranked.c.previous_epoch)
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


def _held_in_order(owner: str, swarm_ids: Sequence[str]) -> ColumnElement[bool]:
    """The swarms of `swarm_ids` this owner holds, their rows locked in id order before an
    UPDATE of several touches them: every statement that locks several swarms' rows takes
    them in that order (the group commit too, `commit_statement`), where an UPDATE's own scan
    locks them in whatever order its plan reads them — a heartbeat and a group commit of the
    same two swarms deadlocked that way (PostgreSQL aborted one). SQLite: the file's lock."""
    locked = (select(Swarm.id).where(Swarm.id.in_(list(swarm_ids)), Swarm.lease_owner == owner)
              .order_by(Swarm.id).with_for_update().cte("locked"))
    return and_(Swarm.id.in_(select(locked.c.id)), Swarm.lease_owner == owner)


async def extend_leases(
    session: AsyncSession, owner: str, epochs: dict[str, int], lease_s: float
) -> dict[str, bool]:
    """Extend the leases this process still holds: {swarm id: cancel requested}; a swarm
    missing from the answer was lost."""
    if not epochs:
        return {}
    now = await db_now(session)
    bound = [idle_limit(lease_s)] if _is_pg(session) else []
    rows = await session.execute(
        update(Swarm)
        .where(_held_in_order(owner, list(epochs)))
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
            .where(_held_in_order(owner, swarm_ids))
            .values(lease_owner=None, lease_expires_at=None)
            .returning(Swarm.id)
        )
        await notify(session, QUEUED, list(rows.scalars()))


async def record_takeover(session: AsyncSession, swarm_id: str, epoch: int,
                          in_flight: Sequence[str]) -> list[dict[str, Any]]:
    """Keep the fruitless takeovers this claim's `rescues` counts, each with the subtasks
    its dead owner had in flight (the swarm's row locked by the caller's lease check): reset
    by a fruitful claim, one more entry when the count grew, unchanged after a release."""
    rescues, kept = (await session.execute(
        select(Swarm.rescues, Swarm.takeovers).where(Swarm.id == swarm_id))).one()
    before: list[dict[str, Any]] = list(kept or [])
    if not rescues:
        after: list[dict[str, Any]] = []
    elif rescues > len(before):
        after = [*before, {"epoch": epoch, "in_flight": sorted(set(in_flight))}][-rescues:]
    else:
        after = before[-rescues:]
    if after != before:
        await session.execute(update(Swarm).where(Swarm.id == swarm_id).values(takeovers=after))
    return after


async def load_swarms_for_run(session: AsyncSession, swarm_ids: Sequence[str]
                              ) -> dict[str, tuple[Swarm, list[Subtask]]]:
    """Several claimed swarms with their subtasks in two queries (a burst of claims must not
    cost two round trips per swarm before the first one starts)."""
    if not swarm_ids:
        return {}
    swarms = (await session.execute(select(Swarm).where(Swarm.id.in_(list(swarm_ids))))).scalars()
    subs = await get_subtasks(session, swarm_ids, prompts=True)
    return {s.id: (s, subs[s.id]) for s in swarms}
