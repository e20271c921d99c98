"""audit: one append-only row per change a caller makes (SPEC §16): time, tenant, key id (never
the key), action, swarm, request id, client address; read a tenant's newest first

Revision ID: 0023_audit
Revises: 0016_swarm_vote
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.base import BigId
from app.db.types import UTCDateTime

revision: str = "0023_audit"
down_revision: str | None = "0016_swarm_vote"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("id", BigId, autoincrement=True),
        sa.Column("time", UTCDateTime(), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(64)),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("swarm_id", sa.String(36)),
        sa.Column("request_id", sa.String(128)),
        sa.Column("client", sa.String(64)),
        sa.PrimaryKeyConstraint("id", name="pk_audit"),
    )
    op.create_index("ix_audit_tenant_id", "audit", ["tenant", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_tenant_id", table_name="audit")
    op.drop_table("audit")
