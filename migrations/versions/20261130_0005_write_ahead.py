"""write-ahead attempts: the ledger's reservation per attempt, swarms.unresolved_usd, the task
stored once (subtask prompts NULL = the task), subtasks.sanitized

Revision ID: 0005_write_ahead
Revises: 0009_tools
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.types import Money

revision: str = "0005_write_ahead"
down_revision: str | None = "0009_tools"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _worker_system_sql() -> str:
    """planner.worker_system_prompt(task) in SQL: a planned worker's NULL system prompt."""
    nl = "chr(10)" if op.get_bind().dialect.name == "postgresql" else "char(10)"
    return ("'You are a sub-agent in a team working on this overall task:' || " + nl
            + " || (SELECT task FROM swarms WHERE swarms.id = subtasks.swarm_id) || " + nl
            + " || " + nl + " || 'Do only your own part, thoroughly and concretely.'")


def upgrade() -> None:
    with op.batch_alter_table("gateway_calls") as batch:
        # the worst case held while the attempt is `in_flight`; an `unknown` row is billed at it
        batch.add_column(sa.Column("reserved_usd", Money(), nullable=False,
                                   server_default="0"))
    with op.batch_alter_table("swarms") as batch:
        batch.add_column(sa.Column("unresolved_usd", Money(), nullable=False,
                                   server_default="0"))
    with op.batch_alter_table("subtasks") as batch:
        batch.alter_column("prompt", existing_type=sa.Text(), nullable=True)
        batch.alter_column("system_prompt", existing_type=sa.Text(), nullable=True)
        batch.add_column(sa.Column("sanitized", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
    # the task was copied into every subtask: keep one copy (on the swarm)
    op.execute("UPDATE subtasks SET prompt = NULL WHERE prompt = "
               "(SELECT task FROM swarms WHERE swarms.id = subtasks.swarm_id)")
    op.execute(f"UPDATE subtasks SET system_prompt = NULL WHERE kind = 'worker' AND "
               f"system_prompt = {_worker_system_sql()}")


def downgrade() -> None:
    op.execute("UPDATE subtasks SET prompt = (SELECT task FROM swarms "
               "WHERE swarms.id = subtasks.swarm_id) WHERE prompt IS NULL")
    op.execute(f"UPDATE subtasks SET system_prompt = {_worker_system_sql()} "
               "WHERE system_prompt IS NULL AND kind = 'worker'")
    op.execute("UPDATE subtasks SET system_prompt = '' WHERE system_prompt IS NULL")
    with op.batch_alter_table("subtasks") as batch:
        batch.drop_column("sanitized")
        batch.alter_column("system_prompt", existing_type=sa.Text(), nullable=False)
        batch.alter_column("prompt", existing_type=sa.Text(), nullable=False)
    with op.batch_alter_table("swarms") as batch:
        batch.drop_column("unresolved_usd")
    with op.batch_alter_table("gateway_calls") as batch:
        batch.drop_column("reserved_usd")
