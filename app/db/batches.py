"""The engine's batched writes, each dialect its own way behind one call: the group commit of
swarms' writes (with the tenant cap settlements they carry) and a tenant cap's batch of
reservations and settlements.

PostgreSQL runs each batch as one statement, a transaction of its own, on the driver (no
session, no BEGIN/COMMIT, no ORM around its round trip); SQLite as a transaction through the
ORM. Either is retried while the database is unavailable, and is idempotent, so a retry after
a commit whose answer was lost duplicates nothing.
"""

from __future__ import annotations

import functools
from decimal import Decimal
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from app.db import tenant_cap
from app.db.changes import SwarmWrite
from app.db.commit_statement import statement
from app.db.dialect import dialect_of, engine_of
from app.db.driver import DirectConnection, fetchrow_pooled
from app.db.retry import in_transaction, retrying
from app.db.session import SessionFactory
from app.db.spend import DailyCheck
from app.db.writes import apply_spend_only, apply_writes


class GroupCommit(Protocol):
    """Where the state writer commits a batch of swarms' writes."""

    async def apply(self, writes: list[SwarmWrite]) -> set[str]:
        """Commit `writes` as one transaction; the ids of the swarms whose lease `owner` no
        longer holds (their writes were fenced out, nothing of them stored)."""
        ...

    async def close(self) -> None: ...


class _OneStatement:
    """PostgreSQL: one statement per batch, on the group commit's own connection."""

    def __init__(self, sessions: SessionFactory, owner: str, retry_for_s: float) -> None:
        url = engine_of(sessions).url.render_as_string(hide_password=False)
        self._direct = DirectConnection(url)
        self._owner = owner
        self._retry_for_s = retry_for_s

    async def apply(self, writes: list[SwarmWrite]) -> set[str]:
        stmt, direct = statement(self._owner, writes), self._direct
        return stmt.fenced(await retrying(lambda: direct.fetch(stmt.sql, stmt.args),
                                          self._retry_for_s))

    async def close(self) -> None:
        await self._direct.close()


class _Transaction:
    """SQLite: one ORM transaction per batch."""

    def __init__(self, sessions: SessionFactory, owner: str, retry_for_s: float) -> None:
        self._sessions = sessions
        self._owner = owner
        self._retry_for_s = retry_for_s

    async def apply(self, writes: list[SwarmWrite]) -> set[str]:
        return await in_transaction(self._sessions, lambda session: self._writes(
            session, writes), retry_for_s=self._retry_for_s)

    async def _writes(self, session: AsyncSession, writes: list[SwarmWrite]) -> set[str]:
        fenced = await apply_writes(session, self._owner, writes, lease_s=self._retry_for_s)
        # in the ledger rows' transaction: the tenant's spend moves with them, or not at all
        settles = [ts for w in writes if w.swarm_id not in fenced for ts in w.settles]
        if settles:
            await tenant_cap.settle_tenants(session, settles)
        return fenced

    async def close(self) -> None:
        return None


def group_commit(sessions: SessionFactory, owner: str, retry_for_s: float) -> GroupCommit:
    """The group commit of `owner`'s writes for the database `sessions` are bound to."""
    kind = _OneStatement if dialect_of(sessions).statements_alone else _Transaction
    return kind(sessions, owner, retry_for_s)


async def spend_only(session: AsyncSession, owner: str, write: SwarmWrite,
                     lease_s: float | None = None) -> bool:
    """`writes.apply_spend_only` with the tenant cap settlements the write carries, in the
    caller's transaction (both databases): the money of a refused write, kept whole."""
    kept = await apply_spend_only(session, owner, write, lease_s)
    if kept and write.settles:
        await tenant_cap.settle_tenants(session, write.settles)
    return kept


async def apply_tenant_ops(sessions: SessionFactory, tenant: str, cap: Decimal,
                           reserves: list[Decimal], settles: list[tenant_cap.Settle],
                           owner: str, lease_s: float) -> list[DailyCheck]:
    """`tenant_cap.apply_tenant_ops` as a transaction of its own, retried while the database is
    unavailable for up to `lease_s` (on PostgreSQL its one statement alone on a pooled
    connection's driver, in autocommit)."""
    if not dialect_of(sessions).statements_alone:
        return await in_transaction(sessions, functools.partial(
            tenant_cap.apply_tenant_ops, tenant=tenant, cap=cap, reserves=reserves,
            settles=settles, owner=owner, lease_s=lease_s), retry_for_s=lease_s)
    engine = engine_of(sessions)
    sql, args = tenant_cap.tenant_ops_statement(tenant, cap, reserves, settles, owner, lease_s)

    async def once() -> list[DailyCheck]:
        row = await fetchrow_pooled(engine, sql, args)
        assert row is not None  # the function answers one row
        return tenant_cap.tenant_checks(row)
    return await retrying(once, lease_s)
