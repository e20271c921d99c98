"""tenant_active: each tenant's count of swarms `max_active_swarms` counts (queued, awaiting
approval, planning, running, synthesizing), kept by triggers on `swarms`, so that a creation's
check reads a few rows where it counted the tenant's active swarms; tenant_admit() reads it

Revision ID: 0024_tenant_active
Revises: 0020_swarm_approval
Create Date: 2026-12-06
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0024_tenant_active"
down_revision: str | None = "0020_swarm_approval"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# states.COUNTED_SWARM as this revision knows it (tests/db/test_active_counts.py holds them equal)
COUNTED = ("queued", "awaiting_approval", "planning", "running", "synthesizing")
_IS_COUNTED = f"status IN ({', '.join(repr(s) for s in COUNTED)})"
# The counts' rows are 0013's shape: PostgreSQL spreads a tenant over 16 rows by the swarm's id,
# so creations of one tenant without a quota (no lock of the tenant's) and the group commits
# that end swarms lock different rows. Every trigger is one per statement, writing its rows in
# (tenant, shard) order: two statements that share rows lock them in the same order and cannot
# deadlock (a row trigger locks them in the statement's row order). No trigger names `status`
# in a WHEN: PostgreSQL would refuse a later change of the column's type (see 0020).
_MOVES = """
    INSERT INTO tenant_active AS a (tenant, shard, active)
    SELECT tenant, hashtext(id) & 15 AS shard, sum(d) FROM ({rows}) AS moves(tenant, id, d)
    GROUP BY 1, 2 HAVING sum(d) <> 0 ORDER BY 1, 2
    ON CONFLICT (tenant, shard) DO UPDATE SET active = a.active + EXCLUDED.active;"""
_OLD = f"SELECT tenant, id, -1 FROM old_rows WHERE {_IS_COUNTED}"
_NEW = f"SELECT tenant, id, 1 FROM new_rows WHERE {_IS_COUNTED}"


def _function(name: str, body: str) -> str:
    return (f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
            f"BEGIN {body}\n    RETURN NULL;\nEND $$")


_PG_FUNCTIONS = (
    _function("swarms_active_insert", _MOVES.format(rows=_NEW)),
    # most updates (a group commit, a heartbeat, a claim) move no swarm in or out: no write
    _function("swarms_active_update", f"""
    IF NOT EXISTS (SELECT 1 FROM old_rows o JOIN new_rows n ON n.id = o.id
                   WHERE o.tenant <> n.tenant OR (o.{_IS_COUNTED}) <> (n.{_IS_COUNTED})) THEN
        RETURN NULL;
    END IF; {_MOVES.format(rows=f"{_OLD} UNION ALL {_NEW}")}"""),
    _function("swarms_active_delete", _MOVES.format(rows=_OLD)),
    _function("swarms_active_truncate", "\n    DELETE FROM tenant_active;"),
)
_PG_TRIGGERS = (
    "CREATE TRIGGER swarms_active_insert AFTER INSERT ON swarms REFERENCING NEW TABLE AS "
    "new_rows FOR EACH STATEMENT EXECUTE FUNCTION swarms_active_insert()",
    "CREATE TRIGGER swarms_active_update AFTER UPDATE ON swarms REFERENCING OLD TABLE AS "
    "old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION swarms_active_update()",
    "CREATE TRIGGER swarms_active_delete AFTER DELETE ON swarms REFERENCING OLD TABLE AS "
    "old_rows FOR EACH STATEMENT EXECUTE FUNCTION swarms_active_delete()",
    "CREATE TRIGGER swarms_active_truncate AFTER TRUNCATE ON swarms FOR EACH STATEMENT "
    "EXECUTE FUNCTION swarms_active_truncate()",
)
# SQLite: one writer at a time, one row a tenant (shard 0), row triggers
_SQLITE_ADD = ("INSERT INTO tenant_active (tenant, shard, active) VALUES (NEW.tenant, 0, 1) "
               "ON CONFLICT (tenant, shard) DO UPDATE SET active = active + 1;")
_SQLITE_REMOVE = ("INSERT INTO tenant_active (tenant, shard, active) VALUES (OLD.tenant, 0, -1) "
                  "ON CONFLICT (tenant, shard) DO UPDATE SET active = active - 1;")
_OLD_IN, _NEW_IN = f"OLD.{_IS_COUNTED}", f"NEW.{_IS_COUNTED}"
_SQLITE_TRIGGERS = (
    f"CREATE TRIGGER swarms_active_insert AFTER INSERT ON swarms FOR EACH ROW WHEN {_NEW_IN} "
    f"BEGIN {_SQLITE_ADD} END",
    f"CREATE TRIGGER swarms_active_delete AFTER DELETE ON swarms FOR EACH ROW WHEN {_OLD_IN} "
    f"BEGIN {_SQLITE_REMOVE} END",
    "CREATE TRIGGER swarms_active_leave AFTER UPDATE OF status, tenant ON swarms FOR EACH ROW "
    f"WHEN ({_OLD_IN}) AND (NOT ({_NEW_IN}) OR NEW.tenant <> OLD.tenant) "
    f"BEGIN {_SQLITE_REMOVE} END",
    "CREATE TRIGGER swarms_active_enter AFTER UPDATE OF status, tenant ON swarms FOR EACH ROW "
    f"WHEN ({_NEW_IN}) AND (NOT ({_OLD_IN}) OR NEW.tenant <> OLD.tenant) "
    f"BEGIN {_SQLITE_ADD} END",
)
_FUNCTION_NAMES = ("swarms_active_insert", "swarms_active_update", "swarms_active_delete",
                   "swarms_active_truncate")
_TRIGGER_NAMES = ("swarms_active_insert", "swarms_active_update", "swarms_active_delete",
                  "swarms_active_truncate", "swarms_active_leave", "swarms_active_enter")

# tenant_admit (0014) reads the tenant's counts, not its rows; the rest of it is unchanged
_COUNT_ROWS = """SELECT count(*) INTO v_active FROM swarms
        WHERE tenant = p_tenant AND status = ANY(p_active) AND id <> p_own;"""
_COUNT_KEPT = """SELECT coalesce(sum(active), 0) INTO v_active FROM tenant_active
        WHERE tenant = p_tenant;"""


def _admit(count: str) -> str:
    """0014's `tenant_admit` with `count` as its count of the tenant's active swarms."""
    path = Path(__file__).with_name("20261204_0014_quota_statements.py")
    spec = importlib.util.spec_from_file_location("quota_statements_0014", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    body: str = module._ADMIT
    assert body.count(_COUNT_ROWS) == 1
    return body.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1).replace(
        _COUNT_ROWS, count)


def upgrade() -> None:
    op.create_table(
        "tenant_active",
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("active", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "shard", name="pk_tenant_active"),
    )
    postgres = op.get_bind().dialect.name == "postgresql"
    # the triggers first: their creation locks `swarms` against writes until this commits, so
    # the count below misses no swarm and counts none twice
    for statement in (*_PG_FUNCTIONS, *_PG_TRIGGERS) if postgres else _SQLITE_TRIGGERS:
        op.execute(statement)
    op.execute("INSERT INTO tenant_active (tenant, shard, active) SELECT tenant, 0, count(*) "
               f"FROM swarms WHERE {_IS_COUNTED} GROUP BY tenant")
    if postgres:
        op.execute(_admit(_COUNT_KEPT))


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        op.execute(_admit(_COUNT_ROWS))
    for name in _TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS {name} ON swarms" if postgres
                   else f"DROP TRIGGER IF EXISTS {name}")
    if postgres:
        for function in _FUNCTION_NAMES:
            op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    op.drop_table("tenant_active")
