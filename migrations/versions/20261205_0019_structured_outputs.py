"""subtasks.output_json, output_status, output_format: a structured output (SPEC §15) — the
parsed value, whether it was valid, repaired or invalid, and the response_format it was asked
with (json_schema, or json_object where the gateway refused json_schema)

Revision ID: 0019_structured_outputs
Revises: 0023_audit
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019_structured_outputs"
down_revision: str | None = "0018_subtask_fallbacks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("subtasks") as batch:
        batch.add_column(sa.Column(
            "output_json", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
            nullable=True))
        batch.add_column(sa.Column("output_status", sa.String(16), nullable=True))
        batch.add_column(sa.Column("output_format", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("subtasks") as batch:
        batch.drop_column("output_format")
        batch.drop_column("output_status")
        batch.drop_column("output_json")
