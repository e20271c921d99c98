"""The tables of the tenant quotas (SPEC §8): the shared token bucket, the tenant daily cap's
spend and reservations, and the trigger-kept queue and active-swarm counts."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import BigInteger, Date, Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base
from app.db.types import Money, UTCDateTime


class TenantBucket(Base):
    """A tenant's token bucket, shared by every API replica: `tokens` as of `updated_at`
    (seconds since the epoch, by the database's clock on PostgreSQL)."""

    __tablename__ = "tenant_buckets"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class TenantDailySpend(Base):
    """Settled spend of one tenant on one UTC day: the tenant daily cap's ledger."""

    __tablename__ = "tenant_daily_spend"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    spent_usd: Mapped[Decimal] = mapped_column(Money, default=Decimal(0))


class TenantDailyReservation(Base):
    """A worst case held against a tenant's daily cap by a call in flight (as
    DailyReservation, per tenant)."""

    __tablename__ = "tenant_daily_reservations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    day: Mapped[date] = mapped_column(Date)
    owner: Mapped[str] = mapped_column(String(64))
    amount: Mapped[Decimal] = mapped_column(Money)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ix_tenant_daily_reservations_tenant_day", "tenant", "day", "expires_at"),
    )


class TenantQueue(Base):
    """How many of a tenant's swarms wait in its queue (`queued`, claimed by no engine), kept
    by triggers on `swarms` (migration 0013) on every insert, status or owner change and
    delete, whatever code path makes it: a new swarm's `queue_position` is their sum + 1 (one
    index lookup), where a count of the queued swarms grows with the backlog (~0.6 ms a
    `POST` at 2,000-3,000 queued). A swarm claimed (or adopted
    at its creation) is starting, not waiting: one adopted never touches the counts.
    PostgreSQL spreads a tenant over 16 rows (by the swarm's id), so concurrent creations of
    one tenant do not queue for one row's lock; SQLite (one writer) uses shard 0."""

    __tablename__ = "tenant_queues"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True)
    queued: Mapped[int] = mapped_column(BigInteger, default=0)


class TenantActive(Base):
    """How many of a tenant's swarms `max_active_swarms` counts (`states.COUNTED_SWARM`: queued,
    awaiting approval, planning, running, synthesizing), kept by triggers on `swarms`
    (migration 0024) in the statement that moves a swarm in or out, whatever code path makes
    it (a creation, an end, a cancel, a decision, an erasure): a creation's check is their sum
    (a few rows), where a count of the swarms grows with what is in flight. Sharded as
    TenantQueue (16 rows on PostgreSQL, shard 0 on SQLite)."""

    __tablename__ = "tenant_active"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True)
    active: Mapped[int] = mapped_column(BigInteger, default=0)
