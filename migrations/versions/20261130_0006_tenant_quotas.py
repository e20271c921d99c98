"""tenant quotas: the shared token bucket, per-tenant daily caps, an index for per-tenant counts

Revision ID: 0006_tenant_quotas
Revises: 0005_write_ahead
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.types import Money, UTCDateTime

revision: str = "0006_tenant_quotas"
down_revision: str | None = "0005_write_ahead"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tenant_buckets",
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", name="pk_tenant_buckets"),
    )
    op.create_table(
        "tenant_daily_spend",
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("spent_usd", Money(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "day", name="pk_tenant_daily_spend"),
    )
    op.create_table(
        "tenant_daily_reservations",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("amount", Money(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tenant_daily_reservations"),
    )
    op.create_index("ix_tenant_daily_reservations_tenant_day", "tenant_daily_reservations",
                    ["tenant", "day", "expires_at"])
    op.create_index("ix_swarms_tenant_status_created", "swarms",
                    ["tenant", "status", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_swarms_tenant_status_created", table_name="swarms")
    op.drop_index("ix_tenant_daily_reservations_tenant_day",
                  table_name="tenant_daily_reservations")
    op.drop_table("tenant_daily_reservations")
    op.drop_table("tenant_daily_spend")
    op.drop_table("tenant_buckets")
