"""swarms.vote: a voted swarm's count (SPEC §3): outcome majority | plurality | no_majority,
the winner and each distinct answer's weight

Revision ID: 0016_swarm_vote
Revises: 0015_webhook_tenants
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016_swarm_vote"
down_revision: str | None = "0015_webhook_tenants"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("swarms") as batch:
        batch.add_column(sa.Column(
            "vote", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("swarms") as batch:
        batch.drop_column("vote")
