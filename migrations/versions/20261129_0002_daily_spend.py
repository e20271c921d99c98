"""daily cap: daily_spend (settled per UTC day) and daily_reservations (calls in flight)

Revision ID: 20261129_0002
Revises: 20261129_0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.types import Money, UTCDateTime

revision: str = "20261129_0002"
down_revision: str | None = "20261129_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "daily_spend",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("spent_usd", Money(), nullable=False),
        sa.PrimaryKeyConstraint("day", name="pk_daily_spend"),
    )
    op.create_table(
        "daily_reservations",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("amount", Money(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_daily_reservations"),
    )
    op.create_index("ix_daily_reservations_day_expires", "daily_reservations",
                    ["day", "expires_at"])


def downgrade() -> None:
    op.drop_index("ix_daily_reservations_day_expires", table_name="daily_reservations")
    op.drop_table("daily_reservations")
    op.drop_table("daily_spend")
