"""retry: swarms.retry_of (the swarm a retry continues) and subtasks.reused

Revision ID: 0008_swarm_retry
Revises: 0007_passthrough_ledger
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_swarm_retry"
down_revision: str | None = "0007_passthrough_ledger"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # plain ADD COLUMN on both databases (no foreign key: SQLite would rebuild `swarms`)
    op.add_column("swarms", sa.Column("retry_of", sa.String(36), nullable=True))
    op.create_index("ix_swarms_retry_of", "swarms", ["retry_of"])
    op.add_column("subtasks", sa.Column("reused", sa.Boolean(), nullable=False,
                                        server_default=sa.false()))


def downgrade() -> None:
    # native DROP COLUMN (SQLite >= 3.35): a batch rebuild of `swarms` with foreign keys on
    # would cascade its DROP TABLE into every child table
    op.drop_column("subtasks", "reused")
    op.drop_index("ix_swarms_retry_of", table_name="swarms")
    op.drop_column("swarms", "retry_of")
