"""tools: subtask tool columns, the tool-call ledger, transcripts of tool-using subtasks

Revision ID: 0009_tools
Revises: 0011_trace_parent
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.base import BigId
from app.db.types import JSONType, UTCDateTime

revision: str = "0009_tools"
down_revision: str | None = "0011_trace_parent"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("subtasks") as batch:
        batch.add_column(sa.Column("tools", JSONType, nullable=False, server_default="[]"))
        batch.add_column(sa.Column("max_turns", sa.Integer(), nullable=False,
                                   server_default="8"))
        batch.add_column(sa.Column("turns", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("tool_calls", sa.Integer(), nullable=False,
                                   server_default="0"))
    op.create_table(
        "tool_calls",
        sa.Column("id", BigId, autoincrement=True),
        sa.Column("swarm_id", sa.String(36), nullable=False),
        sa.Column("subtask_name", sa.String(64), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("call_id", sa.String(128), nullable=False),
        sa.Column("server", sa.String(64), nullable=False),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("result_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tool_calls"),
        sa.ForeignKeyConstraint(["swarm_id"], ["swarms.id"],
                                name="fk_tool_calls_swarm_id_swarms", ondelete="CASCADE"),
        sa.UniqueConstraint("swarm_id", "subtask_name", "turn", "call_id",
                            name="uq_tool_calls_call"),
    )
    op.create_table(
        "transcript_messages",
        sa.Column("swarm_id", sa.String(36), nullable=False),
        sa.Column("subtask_name", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("message", JSONType, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("swarm_id", "subtask_name", "seq",
                                name="pk_transcript_messages"),
        sa.ForeignKeyConstraint(["swarm_id"], ["swarms.id"],
                                name="fk_transcript_messages_swarm_id_swarms",
                                ondelete="CASCADE"),
    )


def downgrade() -> None:
    op.drop_table("transcript_messages")
    op.drop_table("tool_calls")
    with op.batch_alter_table("subtasks") as batch:
        for column in ("tool_calls", "turns", "max_turns", "tools"):
            batch.drop_column(column)
