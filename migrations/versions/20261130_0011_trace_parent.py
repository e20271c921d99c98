"""swarms.trace_parent: the W3C traceparent every process that runs the swarm continues

Revision ID: 0011_trace_parent
Revises: 0008_swarm_retry
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_trace_parent"
down_revision: str | None = "0008_swarm_retry"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("swarms") as batch:
        batch.add_column(sa.Column("trace_parent", sa.String(length=55), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("swarms") as batch:
        batch.drop_column("trace_parent")
