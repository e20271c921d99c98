"""tenant_admit() and tenant_cap_apply(): a creation's quota checks inside its one statement, and
one batch of a tenant's daily cap (settlements, then the reservations that fit) as one statement,
on PostgreSQL

Revision ID: 0014_quota_statements
Revises: 0013_tenant_queues
Create Date: 2026-12-04
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014_quota_statements"
down_revision: str | None = "0013_tenant_queues"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# `tenant_cap.apply_tenant_ops` on PostgreSQL. Every tenant has a daily cap by default, and its
# batches were a transaction of four or five round trips through the ORM before and after every
# call: with SPEC §8's defaults they were most of `serve`'s CPU per 1-agent swarm beside the
# service's own. A plpgsql function keeps the statements and their order (each statement of a
# VOLATILE function reads a snapshot of its own, so the reads after the day row's lock see what
# the lock's last holder committed) and makes the batch one round trip, in autocommit.
#
# Settlements are added to the day the reservation was made on, and only for a reservation this
# call deleted (a batch retried after its answer was lost adds nothing twice), or for one older
# than yesterday, which the cleanup below may have taken before its call ended.
_CREATE = """
CREATE FUNCTION tenant_cap_apply(
    p_tenant varchar, p_cap numeric, p_settled varchar[], p_actuals numeric[],
    p_days date[], p_reserves numeric[], p_owner varchar, p_lease_s double precision,
    OUT o_day date, OUT o_ids varchar[], OUT o_left numeric[], OUT o_live integer[])
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_left numeric;
    v_live integer;
    v_amount numeric;
    v_id varchar;
    v_new_ids varchar[] := '{}';
    v_new_amounts numeric[] := '{}';
BEGIN
    o_day := CAST(timezone('UTC', now()) AS date);
    -- today's row first, always: its lock serialises the tenant's batches in every process
    INSERT INTO tenant_daily_spend AS s (tenant, day, spent_usd) VALUES (p_tenant, o_day, 0)
    ON CONFLICT (tenant, day) DO UPDATE SET spent_usd = s.spent_usd;
    IF cardinality(p_settled) > 0 THEN
        WITH asked AS (
            SELECT * FROM unnest(p_settled, p_actuals, p_days) AS u(id, actual, day)),
        gone AS (
            DELETE FROM tenant_daily_reservations r USING asked
            WHERE r.id = asked.id AND r.tenant = p_tenant
            RETURNING r.id, r.day, asked.actual),
        moved AS (
            SELECT day, actual FROM gone
            UNION ALL
            SELECT day, actual FROM asked
            WHERE day < o_day - 1 AND id NOT IN (SELECT id FROM gone))
        INSERT INTO tenant_daily_spend AS s (tenant, day, spent_usd)
        SELECT p_tenant, day, sum(actual) FROM moved GROUP BY day ORDER BY day
        ON CONFLICT (tenant, day) DO UPDATE SET spent_usd = s.spent_usd + EXCLUDED.spent_usd;
    END IF;
    IF cardinality(p_reserves) = 0 THEN
        RETURN;
    END IF;
    -- a dead process's reservations hold their day's money, that day only
    DELETE FROM tenant_daily_reservations WHERE tenant = p_tenant AND day < o_day - 1;
    -- what is left: an expired reservation holds its amount too, but is not live
    SELECT p_cap - s.spent_usd - coalesce((
               SELECT sum(amount) FROM tenant_daily_reservations
               WHERE tenant = p_tenant AND day = o_day), 0),
           (SELECT count(*) FROM tenant_daily_reservations
            WHERE tenant = p_tenant AND day = o_day AND expires_at > now())
      INTO v_left, v_live
      FROM tenant_daily_spend s WHERE s.tenant = p_tenant AND s.day = o_day;
    o_ids := '{}';
    o_left := '{}';
    o_live := '{}';
    -- in order: one that does not fit is refused, and a later smaller one may still fit
    FOREACH v_amount IN ARRAY p_reserves LOOP
        o_left := array_append(o_left, v_left);
        o_live := array_append(o_live, v_live);
        IF v_amount > v_left THEN
            o_ids := array_append(o_ids, NULL::varchar);
        ELSE
            v_id := replace(CAST(gen_random_uuid() AS text), '-', '');
            o_ids := array_append(o_ids, v_id);
            v_new_ids := array_append(v_new_ids, v_id);
            v_new_amounts := array_append(v_new_amounts, v_amount);
            v_left := v_left - v_amount;
            v_live := v_live + 1;
        END IF;
    END LOOP;
    INSERT INTO tenant_daily_reservations (id, tenant, day, owner, amount, expires_at)
    SELECT id, p_tenant, o_day, p_owner, amount, now() + make_interval(secs => p_lease_s)
    FROM unnest(v_new_ids, v_new_amounts) AS n(id, amount);
END $$
"""

# `POST /swarms`' quota checks (admission.py `_checks`: the bucket's token, the tenant's active
# swarms, its daily cap) called from the creation's statement (creation_statement.creation), before
# its INSERT reads a row: with SPEC §8's defaults a creation was a transaction of five round trips
# through the ORM where, with none, it is one statement. The order and the locks are `_checks`':
# the token's upsert locks the tenant's bucket row (without a bucket, the tenant's advisory lock
# when swarms are counted), and the reads after it see what the lock's last holder committed (a
# statement of a VOLATILE function reads a snapshot of its own); the new swarm is not counted
# (`p_own`), whichever of its INSERT and this runs first. A refusal raises SQLSTATE SQ429 with
# what the answer needs as JSON in its DETAIL, so the token, the rows and the NOTIFY all roll
# back with the statement (quotas.Refused).
_ADMIT = """
CREATE FUNCTION tenant_admit(
    p_tenant varchar, p_size double precision, p_rate double precision, p_max_active bigint,
    p_cap numeric, p_active varchar[], p_own varchar)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now double precision := extract(epoch FROM now());
    v_level double precision;
    v_active bigint;
    v_spent numeric;
BEGIN
    IF p_size IS NOT NULL AND p_rate IS NOT NULL THEN
        INSERT INTO tenant_buckets AS b (tenant, tokens, updated_at)
        VALUES (p_tenant, p_size - 1, v_now)
        ON CONFLICT (tenant) DO UPDATE
            SET tokens = least(b.tokens + greatest(v_now - b.updated_at, 0) * p_rate, p_size) - 1,
                updated_at = v_now
            WHERE least(b.tokens + greatest(v_now - b.updated_at, 0) * p_rate, p_size) >= 1;
        IF NOT FOUND THEN  -- the row is locked all the same: its level now
            SELECT least(tokens + greatest(v_now - updated_at, 0) * p_rate, p_size)
              INTO v_level FROM tenant_buckets WHERE tenant = p_tenant;
            RAISE EXCEPTION USING ERRCODE = 'SQ429', MESSAGE = 'requests_per_minute',
                DETAIL = json_build_object('wait', greatest((1 - v_level) / p_rate, 0.001),
                                           'now', v_now)::text;
        END IF;
    ELSIF p_max_active IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtext('swarm-active:' || p_tenant));
    END IF;
    IF p_max_active IS NOT NULL THEN
        SELECT count(*) INTO v_active FROM swarms
        WHERE tenant = p_tenant AND status = ANY(p_active) AND id <> p_own;
        IF v_active >= p_max_active THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ429', MESSAGE = 'max_active_swarms',
                DETAIL = json_build_object('active', v_active, 'now', v_now)::text;
        END IF;
    END IF;
    IF p_cap IS NOT NULL THEN
        SELECT spent_usd INTO v_spent FROM tenant_daily_spend
        WHERE tenant = p_tenant AND day = CAST(timezone('UTC', now()) AS date);
        IF coalesce(v_spent, 0) >= p_cap THEN
            RAISE EXCEPTION USING ERRCODE = 'SQ429', MESSAGE = 'daily_budget_usd',
                DETAIL = json_build_object('spent', CAST(v_spent AS text), 'now', v_now)::text;
        END IF;
    END IF;
    RETURN true;
END $$
"""
_SIGNATURES = (
    "tenant_cap_apply(varchar, numeric, varchar[], numeric[], date[], numeric[], varchar, "
    "double precision)",
    "tenant_admit(varchar, double precision, double precision, bigint, numeric, varchar[], "
    "varchar)")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite runs the statements one by one
        op.execute(_CREATE)
        op.execute(_ADMIT)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for signature in _SIGNATURES:
            op.execute(f"DROP FUNCTION IF EXISTS {signature}")
