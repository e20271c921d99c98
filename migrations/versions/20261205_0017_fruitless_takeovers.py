"""swarms.settled_epoch and swarms.takeovers: the crash-loop rule counts only fruitless
takeovers (no call of the swarm settled since the previous claim) and names the subtasks in
flight at each of them

Revision ID: 0017_fruitless_takeovers
Revises: 0016_swarm_vote
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017_fruitless_takeovers"
down_revision: str | None = "0022_swarm_erasure"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("swarms") as batch:
        batch.add_column(sa.Column("settled_epoch", sa.Integer(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column(
            "takeovers", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
            nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("swarms") as batch:
        batch.drop_column("takeovers")
        batch.drop_column("settled_epoch")
