"""ledger: rows of the OpenAI facade's passthrough calls belong to no swarm or subtask

Revision ID: 0007_passthrough_ledger
Revises: 20261129_0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_passthrough_ledger"
down_revision: str | None = "20261129_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gateway_calls") as batch:
        batch.alter_column("swarm_id", existing_type=sa.String(36), nullable=True)
        batch.alter_column("subtask_name", existing_type=sa.String(64), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM gateway_calls WHERE swarm_id IS NULL OR subtask_name IS NULL")
    with op.batch_alter_table("gateway_calls") as batch:
        batch.alter_column("subtask_name", existing_type=sa.String(64), nullable=False)
        batch.alter_column("swarm_id", existing_type=sa.String(36), nullable=False)
