"""webhooks: one delivery per terminal swarm with a webhook_url, and every attempt

Revision ID: 20261129_0003
Revises: 20261129_0002
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.base import BigId
from app.db.types import UTCDateTime

revision: str = "20261129_0003"
down_revision: str | None = "20261129_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("swarm_id", sa.String(36), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime()),
        sa.PrimaryKeyConstraint("swarm_id", name="pk_webhooks"),
        sa.ForeignKeyConstraint(["swarm_id"], ["swarms.id"], name="fk_webhooks_swarm_id_swarms",
                                ondelete="CASCADE"),
    )
    op.create_index("ix_webhooks_state_next", "webhooks", ["state", "next_attempt_at"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", BigId, autoincrement=True),
        sa.Column("swarm_id", sa.String(36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer()),
        sa.Column("error", sa.Text()),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_attempts"),
        sa.ForeignKeyConstraint(["swarm_id"], ["swarms.id"],
                                name="fk_webhook_attempts_swarm_id_swarms", ondelete="CASCADE"),
    )
    op.create_index("ix_webhook_attempts_swarm", "webhook_attempts", ["swarm_id", "attempt"])


def downgrade() -> None:
    op.drop_index("ix_webhook_attempts_swarm", table_name="webhook_attempts")
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhooks_state_next", table_name="webhooks")
    op.drop_table("webhooks")
