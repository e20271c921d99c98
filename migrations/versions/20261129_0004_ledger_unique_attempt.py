"""ledger: one row per (idempotency_key, attempt), so retried group commits stay idempotent

Revision ID: 20261129_0004
Revises: 20261129_0003
Create Date: 2026-11-29
"""

from collections.abc import Sequence

from alembic import op

revision: str = "20261129_0004"
down_revision: str | None = "20261129_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gateway_calls") as batch:
        batch.create_unique_constraint("uq_gateway_calls_key_attempt",
                                       ["idempotency_key", "attempt"])


def downgrade() -> None:
    with op.batch_alter_table("gateway_calls") as batch:
        batch.drop_constraint("uq_gateway_calls_key_attempt", type_="unique")
