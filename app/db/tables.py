"""The tables of DESIGN.md "Data", as typed SQLAlchemy 2 models (the tenant quotas' are
tenant_tables.py's; the engine's live copies of two of them, live_rows.py's)."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Date,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

# the tenant quotas' tables are tenant_tables.py's, on the same metadata: loaded with this
# module so that METADATA (below) holds every table
from app.db import tenant_tables  # noqa: F401
from app.db.base import Base, BigId
from app.db.sealed import SealedJSON, SealedText
from app.db.types import JSONType, Money, StatusColumn, UTCDateTime, utcnow
from app.states import SubtaskKind, SubtaskStatus, SwarmStatus, WebhookState

# every table's metadata: read here, not as base.Base.metadata, so every table module is loaded
METADATA = Base.metadata


class Swarm(Base):
    __tablename__ = "swarms"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    # 24 characters for `awaiting_approval` (migration 0020); SQLite enforces no length, and
    # its column keeps the type the first migration declared
    status: Mapped[SwarmStatus] = mapped_column(
        StatusColumn(SwarmStatus, 24).with_variant(StatusColumn(SwarmStatus), "sqlite"))
    # the content columns (SPEC §16) are Sealed*: encrypted at rest when keys are configured
    task: Mapped[str] = mapped_column(SealedText)
    spec: Mapped[dict[str, Any]] = mapped_column(SealedJSON)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", SealedJSON, default=dict)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    budget_usd: Mapped[Decimal | None] = mapped_column(Money)
    spent_usd: Mapped[Decimal] = mapped_column(Money, default=Decimal(0))
    reserved_usd: Mapped[Decimal] = mapped_column(Money, default=Decimal(0))
    # the part of spent_usd billed at reservations: attempts whose outcome a crash lost
    unresolved_usd: Mapped[Decimal] = mapped_column(Money, default=Decimal(0))
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    gateway_calls: Mapped[int] = mapped_column(Integer, default=0)
    result: Mapped[str | None] = mapped_column(SealedText)
    error: Mapped[dict[str, Any] | None] = mapped_column(SealedJSON)
    # a voted swarm's count: outcome, winner, weights (SPEC §3; migration 0016)
    vote: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lease_epoch: Mapped[int] = mapped_column(Integer, default=0)
    # consecutive fruitless takeovers (SPEC §4 crash loops; migration 0017): a takeover is
    # fruitless when no call settled in the epoch it ends, i.e. settled_epoch < lease_epoch
    rescues: Mapped[int] = mapped_column(Integer, default=0)
    # the last lease epoch in which a call of the swarm settled (by an answer, not a takeover)
    settled_epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # the fruitless takeovers counted in `rescues`: [{epoch, in_flight: [subtask names]}]
    takeovers: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType, default=None)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    event_seq: Mapped[int] = mapped_column(Integer, default=0)
    # the swarm this one retries (POST /swarms/{id}/retry); no foreign key: the old swarm
    # is never touched, and SQLite would have to rebuild the table to add one
    retry_of: Mapped[str | None] = mapped_column(String(36), default=None)
    # W3C traceparent of the swarm's trace (app/tracing.py), continued by every process
    trace_parent: Mapped[str | None] = mapped_column(String(55))
    # when its content was erased (SPEC §16: DELETE, retention, prune); its money stays
    erased_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    # the approval gate (SPEC §14, migration 0020): the plan, its estimate and the decision;
    # while the swarm awaits approval, when it times out
    approval: Mapped[dict[str, Any] | None] = mapped_column(SealedJSON, default=None)
    approval_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)

    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_swarms_tenant_idempotency_key"),
        Index("ix_swarms_tenant_created", "tenant", "created_at", "id"),
        Index("ix_swarms_status_lease", "status", "lease_expires_at"),
        Index("ix_swarms_retry_of", "retry_of"),
        # per-tenant counts: active swarms at admission, queue_position (0006)
        Index("ix_swarms_tenant_status_created", "tenant", "status", "created_at"),
        # the retention sweep's lookup: ended swarms whose content is still there (0022)
        Index("ix_swarms_erasable", "finished_at",
              postgresql_where=text("erased_at IS NULL AND finished_at IS NOT NULL"),
              sqlite_where=text("erased_at IS NULL AND finished_at IS NOT NULL")),
        Index("ix_swarms_approval_due_at", "approval_due_at"),
    )


class Subtask(Base):
    __tablename__ = "subtasks"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    swarm_id: Mapped[str] = mapped_column(ForeignKey("swarms.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    position: Mapped[int] = mapped_column(Integer)
    kind: Mapped[SubtaskKind] = mapped_column(StatusColumn(SubtaskKind))
    model: Mapped[str] = mapped_column(String(64))
    depends_on: Mapped[list[str]] = mapped_column(JSONType, default=list)
    # NULL: the default, resolved when the call is made (the prompt: the swarm's task; a
    # planned worker's system prompt: built from the task), so the task is stored once
    system_prompt: Mapped[str | None] = mapped_column(SealedText)
    prompt: Mapped[str | None] = mapped_column(SealedText)
    max_tokens: Mapped[int] = mapped_column(Integer)
    temperature: Mapped[float | None] = mapped_column(Float)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    status: Mapped[SubtaskStatus] = mapped_column(StatusColumn(SubtaskStatus))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    output: Mapped[str | None] = mapped_column(SealedText)
    error: Mapped[dict[str, Any] | None] = mapped_column(SealedJSON)
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    # the output had characters no database stores (NUL, lone surrogates), replaced by U+FFFD
    sanitized: Mapped[bool] = mapped_column(Boolean, default=False)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[Decimal] = mapped_column(Money, default=Decimal(0))
    latency_ms: Mapped[float | None] = mapped_column(Float)
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # succeeded in the swarm this one retries: copied with its output, never called here
    reused: Mapped[bool] = mapped_column(Boolean, default=False)
    # tools (SPEC §9): the agent's selectors, its turn limit, what it has done so far
    tools: Mapped[list[str]] = mapped_column(JSONType, default=list)
    max_turns: Mapped[int] = mapped_column(Integer, default=8)
    turns: Mapped[int] = mapped_column(Integer, default=0)
    tool_calls: Mapped[int] = mapped_column(Integer, default=0)
    # fallback models (SPEC §15): the agent's model list in order, NULL for one model;
    # `model` is the one in use (the one that answered) and `fallbacks` how many were passed
    # over (migration 0018)
    models: Mapped[list[str] | None] = mapped_column(JSONType, default=None)
    fallbacks: Mapped[int] = mapped_column(Integer, default=0)
    # structured outputs (SPEC §15): the parsed value, valid | repaired | invalid, and the
    # response_format asked (json_schema; json_object where the gateway refused it)
    output_json: Mapped[Any] = mapped_column(SealedJSON, nullable=True)
    output_status: Mapped[str | None] = mapped_column(String(16))
    output_format: Mapped[str | None] = mapped_column(String(16))

    __table_args__ = (
        UniqueConstraint("swarm_id", "name", name="uq_subtasks_swarm_id_name"),
        Index("ix_subtasks_swarm_position", "swarm_id", "position"),
    )


class GatewayCall(Base):
    """The ledger: one row per gateway attempt, the truth for spend. A passthrough call of the
    OpenAI facade belongs to no swarm: its swarm_id and subtask_name are NULL.

    Written ahead: the row exists (outcome `in_flight`, `reserved_usd` its worst case, tokens
    the worst case's) before the attempt is sent, and its answer settles it. A takeover settles
    a dead owner's `in_flight` rows as `unknown`, billed at `reserved_usd`. `at_bound`: the
    row's cost is an upper bound, not a usage the gateway reported — an `unknown` attempt, or
    an answer used without a usable usage, billed at its request's bounds."""

    __tablename__ = "gateway_calls"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    swarm_id: Mapped[str | None] = mapped_column(ForeignKey("swarms.id", ondelete="CASCADE"))
    tenant: Mapped[str] = mapped_column(String(128))
    subtask_name: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(64))
    idempotency_key: Mapped[str] = mapped_column(String(200))
    attempt: Mapped[int] = mapped_column(Integer)
    http_status: Mapped[int | None] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(24))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[Decimal] = mapped_column(Money, default=Decimal(0))
    reserved_usd: Mapped[Decimal] = mapped_column(Money, default=Decimal(0))
    at_bound: Mapped[bool] = mapped_column(Boolean, default=False)
    latency_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (
        Index("ix_gateway_calls_swarm", "swarm_id"),
        Index("ix_gateway_calls_tenant_created", "tenant", "created_at"),
        # one row per attempt of a logical call, even across retried commits and takeovers
        UniqueConstraint("idempotency_key", "attempt", name="uq_gateway_calls_key_attempt"),
    )


class Event(Base):
    """Every state change of a swarm, numbered 1, 2, 3... per swarm: the SSE source."""

    __tablename__ = "events"

    swarm_id: Mapped[str] = mapped_column(
        ForeignKey("swarms.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]] = mapped_column(SealedJSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class DailySpend(Base):
    """Settled spend of one UTC day across every swarm and process: the daily cap's ledger."""

    __tablename__ = "daily_spend"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    spent_usd: Mapped[Decimal] = mapped_column(Money, default=Decimal(0))


class DailyReservation(Base):
    """A worst case held against the daily cap by a call in flight; its owner keeps pushing
    `expires_at` forward, so the rows of a crashed process stop counting after one lease."""

    __tablename__ = "daily_reservations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    day: Mapped[date] = mapped_column(Date)
    owner: Mapped[str] = mapped_column(String(64))
    amount: Mapped[Decimal] = mapped_column(Money)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_daily_reservations_day_expires", "day", "expires_at"),)


class Webhook(Base):
    """One terminal-state delivery per swarm with a webhook_url, retried until 2xx or an hour."""

    __tablename__ = "webhooks"

    swarm_id: Mapped[str] = mapped_column(
        ForeignKey("swarms.id", ondelete="CASCADE"), primary_key=True
    )
    tenant: Mapped[str] = mapped_column(String(128))  # the swarm's: deliveries are fair by it
    url: Mapped[str] = mapped_column(Text)
    state: Mapped[WebhookState] = mapped_column(StatusColumn(WebhookState))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    # the claim's lookups: each tenant's pending deliveries, the earliest due first
    __table_args__ = (Index("ix_webhooks_pending_tenant", "tenant", "next_attempt_at",
                            postgresql_where=text(f"state = '{WebhookState.pending}'"),
                            sqlite_where=text(f"state = '{WebhookState.pending}'")),)


class WebhookAttempt(Base):
    """Every delivery attempt: what the receiver answered, or why nothing was sent."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    swarm_id: Mapped[str] = mapped_column(ForeignKey("swarms.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    latency_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (Index("ix_webhook_attempts_swarm", "swarm_id", "attempt"),)


class ToolCall(Base):
    """The tool ledger: one row per tool call of a tool-using subtask."""

    __tablename__ = "tool_calls"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    swarm_id: Mapped[str] = mapped_column(ForeignKey("swarms.id", ondelete="CASCADE"))
    subtask_name: Mapped[str] = mapped_column(String(64))
    turn: Mapped[int] = mapped_column(Integer)
    call_id: Mapped[str] = mapped_column(String(128))
    server: Mapped[str] = mapped_column(String(64))
    tool: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))  # ok | error | timeout
    latency_ms: Mapped[float] = mapped_column(Float)
    result_bytes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (
        # a result committed twice (a retried group commit) is still one row
        UniqueConstraint("swarm_id", "subtask_name", "turn", "call_id",
                         name="uq_tool_calls_call"),
    )


class TranscriptMessage(Base):
    """One message of a tool-using subtask's conversation, appended once, in order."""

    __tablename__ = "transcript_messages"

    swarm_id: Mapped[str] = mapped_column(
        ForeignKey("swarms.id", ondelete="CASCADE"), primary_key=True
    )
    subtask_name: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    turn: Mapped[int] = mapped_column(Integer)
    message: Mapped[dict[str, Any]] = mapped_column(SealedJSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AuditRow(Base):
    """A change a caller made (SPEC §16), append-only: written in the transaction of the change
    it records. No foreign key: the record outlives its swarm's content (erase, prune)."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    time: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    tenant: Mapped[str] = mapped_column(String(128))
    key_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # never the key
    action: Mapped[str] = mapped_column(String(16))
    swarm_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    client: Mapped[str | None] = mapped_column(String(64), nullable=True)

    __table_args__ = (
        Index("ix_audit_tenant_id", "tenant", "id"),  # a tenant's page, newest first
    )
