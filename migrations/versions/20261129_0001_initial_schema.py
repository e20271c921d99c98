"""initial schema: swarms, subtasks, the gateway_calls ledger, events

Revision ID: 20261129_0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.base import BigId
from app.db.types import JSONType, Money, UTCDateTime

revision: str = "20261129_0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "swarms",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("spec", JSONType, nullable=False),
        sa.Column("metadata", JSONType, nullable=False),
        sa.Column("idempotency_key", sa.String(255)),
        sa.Column("request_hash", sa.String(64)),
        sa.Column("budget_usd", Money()),
        sa.Column("spent_usd", Money(), nullable=False),
        sa.Column("reserved_usd", Money(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("gateway_calls", sa.Integer(), nullable=False),
        sa.Column("result", sa.Text()),
        sa.Column("error", JSONType),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime()),
        sa.Column("finished_at", UTCDateTime()),
        sa.Column("lease_owner", sa.String(64)),
        sa.Column("lease_expires_at", UTCDateTime()),
        sa.Column("lease_epoch", sa.Integer(), nullable=False),
        sa.Column("rescues", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_swarms"),
        sa.UniqueConstraint("tenant", "idempotency_key", name="uq_swarms_tenant_idempotency_key"),
    )
    op.create_index("ix_swarms_tenant_created", "swarms", ["tenant", "created_at", "id"])
    op.create_index("ix_swarms_status_lease", "swarms", ["status", "lease_expires_at"])

    op.create_table(
        "subtasks",
        sa.Column("id", BigId, autoincrement=True),
        sa.Column("swarm_id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("depends_on", JSONType, nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("max_tokens", sa.Integer(), nullable=False),
        sa.Column("temperature", sa.Float()),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("output", sa.Text()),
        sa.Column("error", JSONType),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", Money(), nullable=False),
        sa.Column("latency_ms", sa.Float()),
        sa.Column("ready_at", UTCDateTime()),
        sa.Column("started_at", UTCDateTime()),
        sa.Column("finished_at", UTCDateTime()),
        sa.PrimaryKeyConstraint("id", name="pk_subtasks"),
        sa.ForeignKeyConstraint(
            ["swarm_id"], ["swarms.id"], name="fk_subtasks_swarm_id_swarms", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("swarm_id", "name", name="uq_subtasks_swarm_id_name"),
    )
    op.create_index("ix_subtasks_swarm_position", "subtasks", ["swarm_id", "position"])

    op.create_table(
        "gateway_calls",
        sa.Column("id", BigId, autoincrement=True),
        sa.Column("swarm_id", sa.String(36), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("subtask_name", sa.String(64), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("http_status", sa.Integer()),
        sa.Column("outcome", sa.String(24), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", Money(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_gateway_calls"),
        sa.ForeignKeyConstraint(
            ["swarm_id"], ["swarms.id"], name="fk_gateway_calls_swarm_id_swarms",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_gateway_calls_swarm", "gateway_calls", ["swarm_id"])
    op.create_index("ix_gateway_calls_tenant_created", "gateway_calls", ["tenant", "created_at"])

    op.create_table(
        "events",
        sa.Column("swarm_id", sa.String(36), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("data", JSONType, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("swarm_id", "seq", name="pk_events"),
        sa.ForeignKeyConstraint(
            ["swarm_id"], ["swarms.id"], name="fk_events_swarm_id_swarms", ondelete="CASCADE"
        ),
    )


def downgrade() -> None:
    op.drop_table("events")
    op.drop_index("ix_gateway_calls_tenant_created", table_name="gateway_calls")
    op.drop_index("ix_gateway_calls_swarm", table_name="gateway_calls")
    op.drop_table("gateway_calls")
    op.drop_index("ix_subtasks_swarm_position", table_name="subtasks")
    op.drop_table("subtasks")
    op.drop_index("ix_swarms_status_lease", table_name="swarms")
    op.drop_index("ix_swarms_tenant_created", table_name="swarms")
    op.drop_table("swarms")
