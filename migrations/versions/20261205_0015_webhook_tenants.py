"""webhook_tenants: a delivery names its swarm's tenant, and the due deliveries are indexed by
tenant, so that the sender takes them round-robin across tenants (SPEC §8) by a lookup per
tenant, however many one tenant has waiting

Revision ID: 0015_webhook_tenants
Revises: 0014_quota_statements
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_webhook_tenants"
down_revision: str | None = "0014_quota_statements"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# the pending deliveries only: delivered and failed ones (the most, in time) are never claimed
_PENDING = sa.text("state = 'pending'")


def upgrade() -> None:
    with op.batch_alter_table("webhooks") as batch:
        batch.add_column(sa.Column("tenant", sa.String(128), nullable=True))
    op.execute("UPDATE webhooks SET tenant = (SELECT s.tenant FROM swarms s "
               "WHERE s.id = webhooks.swarm_id)")
    with op.batch_alter_table("webhooks") as batch:
        batch.alter_column("tenant", existing_type=sa.String(128), nullable=False)
        batch.drop_index("ix_webhooks_state_next")
        batch.create_index("ix_webhooks_pending_tenant", ["tenant", "next_attempt_at"],
                           postgresql_where=_PENDING, sqlite_where=_PENDING)


def downgrade() -> None:
    with op.batch_alter_table("webhooks") as batch:
        batch.drop_index("ix_webhooks_pending_tenant")
        batch.create_index("ix_webhooks_state_next", ["state", "next_attempt_at"])
        batch.drop_column("tenant")
