"""gateway_calls.at_bound: the row's cost is an upper bound (an `unknown` attempt, or an answer
used without a usable usage), not a usage the gateway reported — what `unresolved_usd` sums

Revision ID: 0012_ledger_at_bound
Revises: 0006_tenant_quotas
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_ledger_at_bound"
down_revision: str | None = "0006_tenant_quotas"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gateway_calls") as batch:
        batch.add_column(sa.Column("at_bound", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
    # what unresolved_usd summed until now: attempts whose outcome was lost, and rows still
    # written ahead (settled at their reservation if their answer never comes)
    op.execute("UPDATE gateway_calls SET at_bound = true "
               "WHERE outcome IN ('unknown', 'in_flight')")


def downgrade() -> None:
    with op.batch_alter_table("gateway_calls") as batch:
        batch.drop_column("at_bound")
