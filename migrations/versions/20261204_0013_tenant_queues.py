"""tenant_queues: each tenant's count of queued swarms no engine has claimed, kept by triggers
on `swarms`, so that a new swarm's queue_position is a lookup, not a count of the backlog

Revision ID: 0013_tenant_queues
Revises: 0012_ledger_at_bound
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_tenant_queues"
down_revision: str | None = "0012_ledger_at_bound"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A swarm is counted while it is `queued` with no lease owner: one an engine claimed (or adopted
# at its creation) is starting, not waiting, and a swarm adopted at creation — the common case
# of `serve` — then never touches the counts. PostgreSQL spreads a tenant's count over 16 rows
# by the swarm's id, so concurrent creations of one tenant lock different rows
# (`hashtext(...) & 15` is 0..15 for a negative hash too: abs() of the smallest
# int overflows). A creation inserts one row: a row trigger, skipped by its WHEN for an adopted
# swarm. An UPDATE or DELETE may move many (a claim takes several swarms of several tenants):
# a statement trigger sums their moves and writes the rows in (tenant, shard) order, so two
# such statements lock the rows they share in the same order and cannot deadlock.
_WAITING = "status = 'queued' AND lease_owner IS NULL"
_OLD, _NEW = (f"OLD.{_WAITING.replace(' AND ', ' AND OLD.')}",
              f"NEW.{_WAITING.replace(' AND ', ' AND NEW.')}")
_PG_FUNCTIONS = ("""
CREATE FUNCTION swarms_queue_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_queues AS q (tenant, shard, queued)
    VALUES (NEW.tenant, hashtext(NEW.id) & 15, 1)
    ON CONFLICT (tenant, shard) DO UPDATE SET queued = q.queued + 1;
    RETURN NULL;
END $$""", f"""
CREATE FUNCTION swarms_queue_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- most updates (a group commit, a heartbeat) touch claimed swarms only: no write
    IF NOT EXISTS (SELECT 1 FROM old_rows WHERE {_WAITING})
       AND NOT EXISTS (SELECT 1 FROM new_rows WHERE {_WAITING}) THEN
        RETURN NULL;
    END IF;
    INSERT INTO tenant_queues AS q (tenant, shard, queued)
    SELECT tenant, shard, sum(d) FROM (
        SELECT tenant, hashtext(id) & 15 AS shard, -1 AS d FROM old_rows WHERE {_WAITING}
        UNION ALL
        SELECT tenant, hashtext(id) & 15, 1 FROM new_rows WHERE {_WAITING}
    ) moves GROUP BY tenant, shard HAVING sum(d) <> 0 ORDER BY tenant, shard
    ON CONFLICT (tenant, shard) DO UPDATE SET queued = q.queued + EXCLUDED.queued;
    RETURN NULL;
END $$""", f"""
CREATE FUNCTION swarms_queue_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_queues AS q (tenant, shard, queued)
    SELECT tenant, hashtext(id) & 15 AS shard, -count(*) FROM old_rows WHERE {_WAITING}
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (tenant, shard) DO UPDATE SET queued = q.queued + EXCLUDED.queued;
    RETURN NULL;
END $$""", """
CREATE FUNCTION swarms_queue_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM tenant_queues;
    RETURN NULL;
END $$""")
_PG_TRIGGERS = (
    "CREATE TRIGGER swarms_queued_insert AFTER INSERT ON swarms FOR EACH ROW "
    f"WHEN ({_NEW}) EXECUTE FUNCTION swarms_queue_insert()",
    "CREATE TRIGGER swarms_queued_update AFTER UPDATE ON swarms REFERENCING OLD TABLE AS "
    "old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION swarms_queue_update()",
    "CREATE TRIGGER swarms_queued_delete AFTER DELETE ON swarms REFERENCING OLD TABLE AS "
    "old_rows FOR EACH STATEMENT EXECUTE FUNCTION swarms_queue_delete()",
    "CREATE TRIGGER swarms_queued_truncate AFTER TRUNCATE ON swarms FOR EACH STATEMENT "
    "EXECUTE FUNCTION swarms_queue_truncate()",
)
# SQLite: one writer at a time, one row a tenant (shard 0)
_SQLITE_ADD = ("INSERT INTO tenant_queues (tenant, shard, queued) VALUES (NEW.tenant, 0, 1) "
               "ON CONFLICT (tenant, shard) DO UPDATE SET queued = queued + 1;")
_SQLITE_REMOVE = ("INSERT INTO tenant_queues (tenant, shard, queued) VALUES (OLD.tenant, 0, -1) "
                  "ON CONFLICT (tenant, shard) DO UPDATE SET queued = queued - 1;")
_SQLITE_TRIGGERS = (
    "CREATE TRIGGER swarms_queued_insert AFTER INSERT ON swarms FOR EACH ROW "
    f"WHEN {_NEW} BEGIN {_SQLITE_ADD} END",
    "CREATE TRIGGER swarms_queued_delete AFTER DELETE ON swarms FOR EACH ROW "
    f"WHEN {_OLD} BEGIN {_SQLITE_REMOVE} END",
    "CREATE TRIGGER swarms_queued_leave AFTER UPDATE OF status, lease_owner, tenant ON swarms "
    f"FOR EACH ROW WHEN ({_OLD}) AND (NOT ({_NEW}) OR NEW.tenant <> OLD.tenant) "
    f"BEGIN {_SQLITE_REMOVE} END",
    "CREATE TRIGGER swarms_queued_enter AFTER UPDATE OF status, lease_owner, tenant ON swarms "
    f"FOR EACH ROW WHEN ({_NEW}) AND (NOT ({_OLD}) OR NEW.tenant <> OLD.tenant) "
    f"BEGIN {_SQLITE_ADD} END",
)
_FUNCTION_NAMES = ("swarms_queue_insert", "swarms_queue_update", "swarms_queue_delete",
                   "swarms_queue_truncate")
_TRIGGER_NAMES = ("swarms_queued_insert", "swarms_queued_delete", "swarms_queued_update",
                  "swarms_queued_truncate", "swarms_queued_leave", "swarms_queued_enter")


def upgrade() -> None:
    op.create_table(
        "tenant_queues",
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("queued", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "shard", name="pk_tenant_queues"),
    )
    postgres = op.get_bind().dialect.name == "postgresql"
    for statement in (*_PG_FUNCTIONS, *_PG_TRIGGERS) if postgres else _SQLITE_TRIGGERS:
        op.execute(statement)
    # the swarms waiting now, counted once (on shard 0: a sum reads every shard)
    op.execute("INSERT INTO tenant_queues (tenant, shard, queued) SELECT tenant, 0, count(*) "
               f"FROM swarms WHERE {_WAITING} GROUP BY tenant")


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for name in _TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS {name} ON swarms" if postgres
                   else f"DROP TRIGGER IF EXISTS {name}")
    if postgres:
        for function in _FUNCTION_NAMES:
            op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    op.drop_table("tenant_queues")
