"""subtasks.models and subtasks.fallbacks: an agent's model list (SPEC §15 fallback models) and
how many of its models were passed over; `model` is the one in use (the one that answered)

Revision ID: 0018_subtask_fallbacks
Revises: 0023_audit
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018_subtask_fallbacks"
down_revision: str | None = "0023_audit"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("subtasks") as batch:
        batch.add_column(sa.Column(
            "models", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True))
        batch.add_column(sa.Column("fallbacks", sa.Integer(), nullable=False,
                                   server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("subtasks") as batch:
        batch.drop_column("fallbacks")
        batch.drop_column("models")
