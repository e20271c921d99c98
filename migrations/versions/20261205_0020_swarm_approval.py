"""swarms.approval and swarms.approval_due_at: the approval gate (SPEC §14). The block holds
the plan, its estimate and the decision; the due time is when an awaiting swarm fails
`approval_timeout` (the sweep reads it by index). The status column grows to 24 characters
for `awaiting_approval`.

Revision ID: 0020_swarm_approval
Revises: 0019_structured_outputs
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020_swarm_approval"
down_revision: str | None = "0017_fruitless_takeovers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 0013's row trigger names `status` in its WHEN: PostgreSQL refuses to change the type of a
# column a trigger depends on, so the trigger is dropped and made again around the change
_INSERT_TRIGGER = (
    "CREATE TRIGGER swarms_queued_insert AFTER INSERT ON swarms FOR EACH ROW "
    "WHEN (NEW.status = 'queued' AND NEW.lease_owner IS NULL) "
    "EXECUTE FUNCTION swarms_queue_insert()")


def _status_length(length: int) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite does not enforce a VARCHAR's length
    op.execute("DROP TRIGGER IF EXISTS swarms_queued_insert ON swarms")
    op.alter_column("swarms", "status", type_=sa.String(length),
                    existing_type=sa.String(24 if length == 16 else 16), existing_nullable=False)
    op.execute(_INSERT_TRIGGER)


def upgrade() -> None:
    _status_length(24)
    with op.batch_alter_table("swarms") as batch:
        batch.add_column(sa.Column(
            "approval", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True))
        batch.add_column(sa.Column("approval_due_at", sa.DateTime(timezone=True),
                                   nullable=True))
    op.create_index("ix_swarms_approval_due_at", "swarms", ["approval_due_at"])


def downgrade() -> None:
    op.drop_index("ix_swarms_approval_due_at", table_name="swarms")
    with op.batch_alter_table("swarms") as batch:
        batch.drop_column("approval_due_at")
        batch.drop_column("approval")
    _status_length(16)
