"""swarms.erased_at: when a swarm's content was erased (DELETE /swarms/{id}, the retention
sweep, `swarm-api prune`); an index of the terminal swarms not erased yet, by end, for the sweep

Revision ID: 0022_swarm_erasure
Revises: 0019_structured_outputs
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.types import UTCDateTime

revision: str = "0022_swarm_erasure"
down_revision: str | None = "0019_structured_outputs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("swarms") as batch:
        batch.add_column(sa.Column("erased_at", UTCDateTime(), nullable=True))
    # the sweep's lookup: ended swarms whose content is still there, oldest end first
    op.create_index("ix_swarms_erasable", "swarms", ["finished_at"],
                    postgresql_where=sa.text("erased_at IS NULL AND finished_at IS NOT NULL"),
                    sqlite_where=sa.text("erased_at IS NULL AND finished_at IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_swarms_erasable", table_name="swarms")
    with op.batch_alter_table("swarms") as batch:
        batch.drop_column("erased_at")
