"""A swarm's creation as one PostgreSQL statement: its row, its subtasks, the calls it writes
ahead, its quota checks, its cap reservations and its audit row, each table's rows sent as a JSON
document (`recordsets`) and inserted by data-modifying CTEs."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from app.db.base import table_of
from app.db.notify import QUEUED
from app.db.quotas import ASYNC_COMMIT, Admit
from app.db.recordsets import Columns, defaults_of, document, json_param, quote, recordset
from app.db.tables import AuditRow, GatewayCall, Subtask, Swarm
from app.db.tenant_cap import CapAsk
from app.db.tenant_tables import TenantQueue

# each table's part of the statement, by the name of its CTE
_SWARMS, _SUBTASKS, _LEDGER = table_of(Swarm), table_of(Subtask), table_of(GatewayCall)
_QUEUES = table_of(TenantQueue)
_AUDIT = table_of(AuditRow)


def creation(swarm: dict[str, Any], subtasks: Sequence[Mapping[str, Any]],
             subtask_keys: tuple[str, ...], *, claim_s: float | None, count: bool,
             admit: Admit | None = None, key_ttl_s: float | None = None,
             ledger: Sequence[Mapping[str, Any]] = (), cap: CapAsk | None = None,
             audit: Sequence[str | None] | None = None) -> tuple[str, tuple[Any, ...]]:
    """A new swarm as one statement: its row (every column given; with `claim_s` leased for that
    many seconds from the database's clock), its subtasks (`subtask_keys` of each), its NOTIFY
    unless claimed (nobody else may claim it: no engine need wake for it), and with `count` the
    tenant's other waiting swarms (the trigger-kept counts as of the statement's snapshot,
    which does not see the new row). It returns one row: the lease's expiry[, the count].
    Two statements (the swarm's, then the subtasks') in a transaction were four round trips:
    BEGIN, two inserts, COMMIT.

    The subtasks' columns that every row has alike (new rows differ in little but their name,
    position and prompts) are sent once, not once per row: a 1,000-agent swarm's document
    holds ~30 keys a row where three vary (547 KB, ~13 ms to encode and parse, sent whole).

    With `admit`, the tenant's quotas are checked in the same statement (migration 0014's
    `tenant_admit`), once its subtasks (and calls without a reservation) are in and before
    the swarm's INSERT, which reads the checks' answer; a refusal raises
    (quotas.Refused.of) and nothing of the statement stays, the token taken included. That
    transaction commits without waiting for its flush (the caller waits for one). With
    `key_ttl_s`, the swarm's Idempotency-Key is first freed from an older swarm that holds it
    past that TTL (that swarm keeps its data), before the new row takes it. `ledger`: rows of
    `gateway_calls` written with it (its first calls' attempts, written ahead: a claimed
    swarm's `SwarmRunner.first_wave`). With `cap`, each row's reservation against the tenant's
    daily cap is asked first (`tenant_cap_apply`, after the swarm's row: every creation takes
    the tenant's bucket, then its day row), a row whose reservation does not fit is not
    written, and the answer row carries the cap's (day, ids, left, live) after the lease's
    expiry (`tenant_cap.tenant_checks`). With `audit` (key id, action, request id, client), the
    creation's audit row is written by the statement too (app/db/audit.py)."""
    sql, sw_cols, st_cols, alike_cols, ledger_cols, ledger_alike = _creation(
        tuple(swarm), _split(subtasks, subtask_keys) if subtasks else None,
        claim_s is not None, count, admit is not None, key_ttl_s is not None,
        _split(ledger, tuple(ledger[0]), _LEDGER_PER_ROW) if ledger else None,
        cap is not None and bool(ledger), audit is not None)
    args: list[Any] = [document([swarm], sw_cols)]
    args += [json_param(_SWARMS.c[key], swarm[key]) for key in _OWN_PARAMETER if key in swarm]
    if st_cols is not None:
        args.append(document(subtasks, st_cols))
    if alike_cols is not None:
        args.append(document(subtasks[:1], alike_cols))
    if ledger_cols is not None:
        args.append(document(ledger, ledger_cols))
        if ledger_alike is not None:
            args.append(document(ledger[:1], ledger_alike))
        if cap is not None:
            args += [cap.cap, list(cap.amounts), cap.owner, float(cap.lease_s), list(cap.keys)]
    if claim_s is not None:
        args.append(float(claim_s))
    if admit is not None:
        args += admit.args(swarm["id"])
    if key_ttl_s is not None:
        args += [swarm["tenant"], swarm["idempotency_key"], float(key_ttl_s)]
    if audit is not None:
        args += list(audit)
    return sql, tuple(args)


# always sent per row: unique to each, so the rows' document is never empty (a subtask's,
# a call's written ahead)
_PER_ROW = ("name", "position")
_LEDGER_PER_ROW = ("idempotency_key",)
# the swarm's columns sent as a `jsonb` parameter of their own: inside the row's document the
# spec (every agent: ~200 KB for 1,000) was parsed as `json`, then again as `jsonb` (6.4 ms)
_OWN_PARAMETER = ("spec",)


def _split(rows: Sequence[Mapping[str, Any]], keys: tuple[str, ...],
           per_row: tuple[str, ...] = _PER_ROW) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the keys whose values differ between rows, the keys every row has alike); `per_row`
    are taken as differing without a look."""
    if len(rows) == 1:  # nothing to compare (a 1-agent swarm): ~a third of its statement's CPU
        return _one_row_split(keys, per_row)
    varying = tuple(k for k in keys if k in per_row or _varies(rows, k))
    return varying, tuple(k for k in keys if k not in varying)


@functools.lru_cache(maxsize=64)
def _one_row_split(keys: tuple[str, ...], per_row: tuple[str, ...]
                   ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`_split` of a single row: only the per-row keys vary."""
    return (tuple(k for k in keys if k in per_row), tuple(k for k in keys if k not in per_row))


def _varies(rows: Sequence[Mapping[str, Any]], key: str) -> bool:
    first = rows[0][key]
    # `is` first: most values of new rows are one object (None, an enum, a small int)
    return not all((v := r[key]) is first or _alike(v, first) for r in rows[1:])


def _alike(a: Any, b: Any) -> bool:
    """Values one document may carry for both: the same object, or equal scalars of one type
    (not `1 == 1.0 == True`, which a JSON column stores apart), or two empty lists (dicts); a
    list or dict with something in it is per row unless shared."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    return not (a or b) if isinstance(a, (dict, list)) else bool(a == b)


# one shape per (claimed, counted, which subtask keys vary) and key set; bounded, as which
# keys vary is the request's to choose
@functools.lru_cache(maxsize=256)
def _creation(swarm_keys: tuple[str, ...],
              subtask_keys: tuple[tuple[str, ...], tuple[str, ...]] | None, claim: bool,
              count: bool, admit: bool, expire_key: bool,
              ledger_keys: tuple[tuple[str, ...], tuple[str, ...]] | None, capped: bool,
              audited: bool = False
              ) -> tuple[str, Columns, Columns | None, Columns | None, Columns | None,
                         Columns | None]:
    params = iter(range(1, 100))
    own = [k for k in _OWN_PARAMETER if k in swarm_keys]
    sw_cols, sw_source = recordset(_SWARMS, tuple(k for k in swarm_keys if k not in own),
                                    params, defaults=False)
    values = {k: f"v.{quote(k)}" for k in sw_cols.keys}
    values.update((k, f"${next(params)}::jsonb") for k in own)
    st_cols = alike_cols = None
    selected: list[str] = []
    if subtask_keys is not None:
        varying, alike = subtask_keys
        st_cols, source = recordset(_SUBTASKS, varying, params, defaults=False)
        selected = [f"v.{quote(k)}" for k in st_cols.keys]
        if alike or defaults_of(_SUBTASKS, varying):
            # the alike keys and the Python-side defaults of the columns no key names: one row
            alike_cols, alike_source = recordset(_SUBTASKS, alike, params, defaults=True,
                                                  given=varying, alias="a")
            selected += [f"a.{quote(k)}" for k in alike_cols.keys]
            source += f" CROSS JOIN {alike_source}"
    ledger_cols, ledger_alike, ahead = ((None, None, []) if ledger_keys is None
                                        else _ahead(ledger_keys, capped, params,
                                                    returning=admit and not capped))
    if claim:
        values["lease_expires_at"] = f"now() + make_interval(secs => ${next(params)}::float8)"
    # One lock order for every creation, this statement's and the session paths' alike (a
    # deadlock otherwise): rows nobody else can lock yet (its subtasks, the calls it writes
    # ahead without a reservation: in before the lock, which is held for less of the statement
    # then), the tenant's (its bucket's row, or its advisory lock), then the key's old holder
    # and the new swarm's row (its key's unique entry), the tenant's day row (the calls'
    # reservations), then the queue counts' shards (locked by the AFTER triggers at the
    # statement's end). Each CTE is read by the next, which orders them. The lock's holder
    # commits without waiting for its WAL flush (ASYNC_COMMIT): the caller waits for one after
    # the lock is released (app/db/durable.py).
    ctes: list[str] = []
    if st_cols is not None:
        columns = [*st_cols.keys, *(alike_cols.keys if alike_cols else ())]
        # the subtasks' foreign key is checked at the statement's end: their swarm is there
        ctes.append(f"new_subtasks AS (INSERT INTO {quote(_SUBTASKS.name)} "
                    f"({', '.join(map(quote, columns))}) SELECT {', '.join(selected)} "
                    f"FROM {source}{' RETURNING 1' if admit else ''})")
    if not capped:  # the ledger's rows: their swarm's foreign key checked at the end, as theirs
        ctes += ahead
    first = [name for name, there in (("new_subtasks", st_cols is not None),
                                      ("new_ledger", bool(ahead) and not capped)) if there]
    admission, admitted = _admission(admit, first, params)
    ctes += admission
    if expire_key:  # then the old holder lets go of the key, before the new row takes it
        tenant, key, ttl = (f"${next(params)}" for _ in range(3))
        ctes.append(f"expired AS (UPDATE {quote(_SWARMS.name)} SET idempotency_key = NULL, "
                    f"request_hash = NULL WHERE tenant = {tenant}::varchar AND idempotency_key = "
                    f"{key}::varchar AND created_at < now() - make_interval(secs => {ttl}::float8) "
                    f"AND {admitted} RETURNING 1)")
        sw_source += " CROSS JOIN (SELECT count(*) FROM expired) AS e"
    sw_source += "" if admitted == "true" else f" WHERE {admitted}"
    ctes.append(f"new_swarm AS (INSERT INTO {quote(_SWARMS.name)} "
                f"({', '.join(map(quote, values))}) SELECT {', '.join(values.values())} "
                f"FROM {sw_source} RETURNING id, tenant, created_at, lease_expires_at)")
    if capped:  # each row only if its reservation, asked after the swarm's row, was granted
        ctes += ahead
    if audited:  # the creation's audit row, only if the swarm's row was written
        key_id, action, request_id, client = (f"${next(params)}::varchar" for _ in range(4))
        ctes.append(f"new_audit AS (INSERT INTO {quote(_AUDIT.name)} (time, tenant, key_id, "
                    f"action, swarm_id, request_id, client) SELECT n.created_at, n.tenant, "
                    f"{key_id}, {action}, n.id, {request_id}, {client} FROM new_swarm n)")
    out = ["n.lease_expires_at"]
    if not claim:
        out.append(f"pg_notify('{QUEUED}', n.id)")
    if count:  # the tenant's waiting swarms but this one (the statement's snapshot: its own
        # row's trigger has not counted it), from the trigger-kept counts (TenantQueue)
        out.append(f"(SELECT coalesce(sum(q.queued), 0) FROM {quote(_QUEUES.name)} q "
                   "WHERE q.tenant = n.tenant)")
    source = "new_swarm n"
    if capped:  # the cap's answer, before the count (read last)
        out[1:1] = ["cap.o_day", "cap.o_ids", "cap.o_left", "cap.o_live"]
        source += " CROSS JOIN cap"
    sql = f"WITH {', '.join(ctes)} SELECT {', '.join(out)} FROM {source}"
    return sql, sw_cols, st_cols, alike_cols, ledger_cols, ledger_alike


def _admission(admit: bool, first: list[str], params: Iterator[int]) -> tuple[list[str], str]:
    """The tenant's checks in the statement: (the CTE that runs them once the CTEs `first`
    are inserted, which it reads, what the swarm's row and key are conditioned on)."""
    if not admit:
        return [], "true"
    call = Admit.CALL.format(*(f"${next(params)}" for _ in range(7)))
    after = " CROSS JOIN ".join(f"(SELECT count(*) FROM {name}) AS {name}_n" for name in first)
    return [f"admitted AS (SELECT {call} AND {ASYNC_COMMIT} AS ok"
            f"{' FROM ' + after if after else ''})"], "(SELECT ok FROM admitted)"


def _ahead(keys: tuple[tuple[str, ...], tuple[str, ...]], capped: bool, params: Iterator[int],
           returning: bool = False) -> tuple[Columns, Columns | None, list[str]]:
    """The creation's calls written ahead: their documents' columns (the keys that vary by
    row, then those alike in one row with the columns' defaults: a 100-call wave's document
    was 42 KB of 16 keys a row, where four vary), and the CTEs that insert them (`capped`:
    each only if the tenant's cap, asked first, reserved it; `returning`: read by the
    admission, which takes the tenant's lock once they are in)."""
    varying, alike = keys
    cols, source = recordset(_LEDGER, varying, params, defaults=False)
    columns = list(cols.keys)
    selected = [f"v.{quote(k)}" for k in cols.keys]
    alike_cols = None
    if alike or defaults_of(_LEDGER, varying):  # (rows of one swarm: its id at least is alike)
        alike_cols, alike_source = recordset(_LEDGER, alike, params, defaults=True,
                                              given=varying, alias="a")
        columns += alike_cols.keys
        selected += [f"a.{quote(k)}" for k in alike_cols.keys]
        source += f" CROSS JOIN {alike_source}"
    ctes = []
    if capped:  # the cap, the amounts, the owner, the lease, the rows' keys
        cap, amounts, owner, lease, row_keys = (f"${next(params)}" for _ in range(5))
        # lateral to the new row: asked after its insert, which took the tenant's lock
        ctes.append("cap AS (SELECT c.o_day, c.o_ids, c.o_left, c.o_live FROM new_swarm n "
                    f"CROSS JOIN LATERAL tenant_cap_apply(n.tenant, {cap}::numeric, "
                    "'{}'::varchar[], '{}'::numeric[], '{}'::date[], "
                    f"{amounts}::numeric[], {owner}::varchar, {lease}::float8) AS c)")
        source += (" WHERE v.idempotency_key IN (SELECT u.key FROM cap CROSS JOIN LATERAL "
                   f"unnest({row_keys}::varchar[], cap.o_ids) AS u(key, rid) "
                   "WHERE u.rid IS NOT NULL)")
    ctes.append(f"new_ledger AS (INSERT INTO {quote(_LEDGER.name)} "
                f"({', '.join(map(quote, columns))}) "
                f"SELECT {', '.join(selected)} FROM {source}{' RETURNING 1' if returning else ''})")
    return cols, alike_cols, ctes
