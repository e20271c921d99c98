"""The group commit as one PostgreSQL statement: each table's rows sent as one JSON document,
read by `json_to_recordset` into set-based UPDATEs and INSERTs, chained as CTEs behind the
fencing UPDATE of the swarms' rows, run in autocommit (one statement is one transaction).
A swarm's creation is built here too (`creation`): its row and its subtasks the same way.

Row by row, a group commit of ~100 writes was ~8 round trips (BEGIN, the lock, one pipelined
executemany per table, COMMIT) and ~400 single-row statements on the server: p50 25 ms, mean
50 ms under a 50-swarm load, and every subtask waits for one before its call is sent (its
ledger row is written ahead). Here it is one round trip and one statement per table.

Why JSON and not column arrays (`unnest($n::type[], …)`, the first form): asyncpg encodes an
array element by element, with ABC `isinstance` checks on each: a commit of 100 writes (a
subtask's state, its ledger row, its event) cost 3.4 to 4.3 ms of client CPU to build and send
as arrays, 2.5 to 2.8 ms as documents (pydantic-core writes them); PostgreSQL's time did not
grow (bench/RESULTS.md, session 8). Values are still what SQLAlchemy would bind (the columns'
bind processors), but for JSON columns, which go into the document as they are: a None there
is SQL NULL (the ORM writes JSON `null`; both read back as None).

Semantics kept from `writes.apply_writes` (SQLite runs that): a swarm is written only
while its row still carries the writer's (epoch, owner) — the UPDATE checks it, and every
other table's rows are filtered on the swarm ids it RETURNs (RETURNING is how data-modifying
CTEs see each other); NOTIFY swarm_changed per written swarm; inserts ignore rows already
there and the ledger settles only `in_flight` rows, so a statement retried after a lost
outcome changes nothing. What one statement cannot do as a sequence of them is see its own
changes or touch a row twice, so rows are merged first: the last state of a subtask wins, and
one inserted in the same batch is inserted in that state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic_core
from sqlalchemy import JSON, Column, Table
from sqlalchemy.dialects import postgresql

from app.db.batch import bind_processor
from app.db.changes import SwarmWrite
from app.db.columns import LEDGER_SETTLED
from app.db.notify import CHANGED, QUEUED
from app.db.quotas import Admit, CapAsk
from app.db.sealed import SealedJSON, seal_json
from app.db.tables import (
    AuditRow,
    Event,
    GatewayCall,
    Subtask,
    Swarm,
    TenantQueue,
    ToolCall,
    TranscriptMessage,
    Webhook,
    table_of,
)
from app.states import AttemptOutcome

_DIALECT = postgresql.asyncpg.dialect()  # type: ignore[no-untyped-call]
_Q = _DIALECT.identifier_preparer.quote


# each table's part of the statement, by the name of its CTE
_SWARMS, _SUBTASKS, _LEDGER = table_of(Swarm), table_of(Subtask), table_of(GatewayCall)
_QUEUES = table_of(TenantQueue)
_AUDIT = table_of(AuditRow)
_INSERTS = {"subtasks": _SUBTASKS, "events": table_of(Event), "webhooks": table_of(Webhook),
            "tool_calls": table_of(ToolCall), "transcript": table_of(TranscriptMessage)}
_TABLES = {"sw": _SWARMS, "st": _SUBTASKS, "ledger": _LEDGER, **_INSERTS}


class Batch:
    """The rows of one group commit, merged as one statement needs them."""

    def __init__(self, writes: Sequence[SwarmWrite]) -> None:
        # id -> the swarm's last write (its epoch and latest state: earlier ones are not read)
        self.swarms: dict[str, SwarmWrite] = {}
        # (swarm, name) -> the subtask's latest state row (name_, position_ and its columns)
        self.updates: dict[tuple[str, str], dict[str, Any]] = {}
        # rows only inserted (ignoring duplicates), by table; new subtasks apart, merged by key
        self.inserts: dict[str, list[dict[str, Any]]] = {
            name: [] for name in _INSERTS if name != "subtasks"}
        self.new_subtasks: dict[tuple[str, str], dict[str, Any]] = {}
        self.ledger: dict[tuple[str, int], dict[str, Any]] = {}
        for w in writes:
            self._add(w)

    def _add(self, w: SwarmWrite) -> None:
        self.swarms[w.swarm_id] = w
        for row in w.new_subtasks:
            self.new_subtasks[(row["swarm_id"], row["name"])] = dict(row)
        for row in w.subtasks:
            key = (w.swarm_id, row["name_"])
            if key in self.new_subtasks:  # inserted in this statement: in its latest state
                self.new_subtasks[key].update(
                    {k: v for k, v in row.items() if not k.endswith("_")})
            else:
                self.updates[key] = row
        for row in w.ledger:
            self.ledger[(row["idempotency_key"], row["attempt"])] = row
        self.inserts["events"].extend(w.events)
        if w.webhook is not None:
            self.inserts["webhooks"].append(w.webhook)
        self.inserts["tool_calls"].extend(w.tool_calls)
        self.inserts["transcript"].extend(w.transcript)


@dataclass(frozen=True)
class Statement:
    """A group commit's SQL and arguments; the rows it returns are the swarms it wrote."""

    sql: str
    args: tuple[Any, ...]
    swarm_ids: frozenset[str]

    def fenced(self, rows: Iterable[Sequence[Any]]) -> set[str]:
        """The swarm ids fenced out (another process holds their lease): not written."""
        return set(self.swarm_ids - {r[0] for r in rows})


def statement(owner: str, writes: Sequence[SwarmWrite]) -> Statement:
    """The writes as one statement, to run in autocommit (`StateWriter` runs it on a
    connection of its own): it holds its row locks no longer than it runs, so unlike the
    engine's transactions it needs no idle bound."""
    batch = Batch(writes)
    swarms = [{"id": w.swarm_id, "epoch": w.epoch, **w.swarm}  # one lock order everywhere
              for _, w in sorted(batch.swarms.items())]
    parts: list[tuple[str, list[dict[str, Any]]]] = [("sw", swarms)]
    inserts = dict(batch.inserts, subtasks=list(batch.new_subtasks.values()))
    parts += [(name, rows) for name, rows in inserts.items() if rows]
    if batch.updates:
        parts.append(("st", [{"swarm_id_": s, **row} for (s, _), row in batch.updates.items()]))
    if batch.ledger:
        parts.append(("ledger", list(batch.ledger.values())))
    shape = tuple((name, tuple(rows[0])) for name, rows in parts)
    sql, columns = _statement(shape)
    args: list[Any] = [owner, [row["id"] for row in swarms]]
    for (_, rows), cols in zip(parts, columns, strict=True):
        args.append(_document(rows, cols))
    return Statement(sql, tuple(args), frozenset(batch.swarms))


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
    position and prompts) are sent once, not once per row: a 1,000-agent swarm's document was
    547 KB of ~30 keys a row where three varied, ~6 ms to encode and ~7 ms for PostgreSQL to
    parse (bench/RESULTS.md, session 15).

    With `admit`, the tenant's quotas are checked first, in the same statement (migration
    0014's `tenant_admit`, which the swarm's INSERT reads before it writes): a refusal raises
    (quotas.Refused.of) and nothing of the statement stays, the token taken included. With
    `key_ttl_s`, the swarm's Idempotency-Key is first freed from an older swarm that holds it
    past that TTL (that swarm keeps its data), before the new row takes it. `ledger`: rows of
    `gateway_calls` written with it (its first calls' attempts, written ahead: a claimed
    swarm's `SwarmRunner.first_wave`). With `cap`, each row's reservation against the tenant's
    daily cap is asked first (`tenant_cap_apply`, after the swarm's row: every creation takes
    the tenant's bucket, then its day row), a row whose reservation does not fit is not
    written, and the answer row carries the cap's (day, ids, left, live) after the lease's
    expiry (`quotas.tenant_checks`). With `audit` (key id, action, request id, client), the
    creation's audit row is written by the statement too (app/db/audit.py)."""
    sql, sw_cols, st_cols, alike_cols, ledger_cols, ledger_alike = _creation(
        tuple(swarm), _split(subtasks, subtask_keys) if subtasks else None,
        claim_s is not None, count, admit is not None, key_ttl_s is not None,
        _split(ledger, tuple(ledger[0]), _LEDGER_PER_ROW) if ledger else None,
        cap is not None and bool(ledger), audit is not None)
    args: list[Any] = [_document([swarm], sw_cols)]
    args += [_json(swarm[key]) for key in _OWN_PARAMETER if key in swarm]
    if st_cols is not None:
        args.append(_document(subtasks, st_cols))
    if alike_cols is not None:
        args.append(_document(subtasks[:1], alike_cols))
    if ledger_cols is not None:
        args.append(_document(ledger, ledger_cols))
        if ledger_alike is not None:
            args.append(_document(ledger[:1], ledger_alike))
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


def _json(value: Any) -> str | None:
    """A JSON column's value as its own parameter's text (None: SQL NULL, as in a document)."""
    return None if value is None else _encode(seal_json(value))


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
              ) -> tuple[str, _Columns, _Columns | None, _Columns | None, _Columns | None,
                         _Columns | None]:
    params = iter(range(1, 100))
    own = [k for k in _OWN_PARAMETER if k in swarm_keys]
    sw_cols, sw_source = _recordset(_SWARMS, tuple(k for k in swarm_keys if k not in own),
                                    params, defaults=False)
    values = {k: f"v.{_Q(k)}" for k in sw_cols.keys}
    values.update((k, f"${next(params)}::jsonb") for k in own)
    st_cols = alike_cols = None
    selected: list[str] = []
    if subtask_keys is not None:
        varying, alike = subtask_keys
        st_cols, source = _recordset(_SUBTASKS, varying, params, defaults=False)
        selected = [f"v.{_Q(k)}" for k in st_cols.keys]
        if alike or _defaults(_SUBTASKS, varying):
            # the alike keys and the Python-side defaults of the columns no key names: one row
            alike_cols, alike_source = _recordset(_SUBTASKS, alike, params, defaults=True,
                                                  given=varying, alias="a")
            selected += [f"a.{_Q(k)}" for k in alike_cols.keys]
            source += f" CROSS JOIN {alike_source}"
    ledger_cols, ledger_alike, ahead = ((None, None, []) if ledger_keys is None
                                        else _ahead(ledger_keys, capped, params))
    if claim:
        values["lease_expires_at"] = f"now() + make_interval(secs => ${next(params)}::float8)"
    # One lock order for every creation, this statement's and the session paths' alike (a
    # deadlock otherwise): the tenant's (its bucket's row, or its advisory lock), then the key's
    # old holder, then the new rows (the queue counts' shards, locked by the AFTER triggers at
    # the statement's end). Each CTE below is read by the next, which orders them.
    ctes = []
    admitted = "true"
    if admit:  # the checks (and their lock) come first
        call = Admit.CALL.format(*(f"${next(params)}" for _ in range(7)))
        ctes.append(f"admitted AS (SELECT {call} AS ok)")
        admitted = "(SELECT ok FROM admitted)"
    if expire_key:  # then the old holder lets go of the key, before the new row takes it
        tenant, key, ttl = (f"${next(params)}" for _ in range(3))
        ctes.append(f"expired AS (UPDATE {_Q(_SWARMS.name)} SET idempotency_key = NULL, "
                    f"request_hash = NULL WHERE tenant = {tenant}::varchar AND idempotency_key = "
                    f"{key}::varchar AND created_at < now() - make_interval(secs => {ttl}::float8) "
                    f"AND {admitted} RETURNING 1)")
        sw_source += " CROSS JOIN (SELECT count(*) FROM expired) AS e"
    if admit:
        sw_source += f" WHERE {admitted}"
    ctes.append(f"new_swarm AS (INSERT INTO {_Q(_SWARMS.name)} ({', '.join(map(_Q, values))}) "
                f"SELECT {', '.join(values.values())} FROM {sw_source} RETURNING id, tenant, "
                "created_at, lease_expires_at)")
    if st_cols is not None:
        columns = [*st_cols.keys, *(alike_cols.keys if alike_cols else ())]
        # the subtasks' foreign key is checked at the statement's end: their swarm is there
        ctes.append(f"new_subtasks AS (INSERT INTO {_Q(_SUBTASKS.name)} "
                    f"({', '.join(map(_Q, columns))}) SELECT {', '.join(selected)} "
                    f"FROM {source})")
    ctes += ahead  # the ledger's rows: their swarm's foreign key checked at the end, as theirs
    if audited:  # the creation's audit row, only if the swarm's row was written
        key_id, action, request_id, client = (f"${next(params)}::varchar" for _ in range(4))
        ctes.append(f"new_audit AS (INSERT INTO {_Q(_AUDIT.name)} (time, tenant, key_id, "
                    f"action, swarm_id, request_id, client) SELECT n.created_at, n.tenant, "
                    f"{key_id}, {action}, n.id, {request_id}, {client} FROM new_swarm n)")
    out = ["n.lease_expires_at"]
    if not claim:
        out.append(f"pg_notify('{QUEUED}', n.id)")
    if count:  # the tenant's waiting swarms but this one (the statement's snapshot: its own
        # row's trigger has not counted it), from the trigger-kept counts (tables.TenantQueue)
        out.append(f"(SELECT coalesce(sum(q.queued), 0) FROM {_Q(_QUEUES.name)} q "
                   "WHERE q.tenant = n.tenant)")
    source = "new_swarm n"
    if capped:  # the cap's answer, before the count (read last)
        out[1:1] = ["cap.o_day", "cap.o_ids", "cap.o_left", "cap.o_live"]
        source += " CROSS JOIN cap"
    sql = f"WITH {', '.join(ctes)} SELECT {', '.join(out)} FROM {source}"
    return sql, sw_cols, st_cols, alike_cols, ledger_cols, ledger_alike


def _ahead(keys: tuple[tuple[str, ...], tuple[str, ...]], capped: bool, params: Iterator[int]
           ) -> tuple[_Columns, _Columns | None, list[str]]:
    """The creation's calls written ahead: their documents' columns (the keys that vary by
    row, then those alike in one row with the columns' defaults: a 100-call wave's document
    was 42 KB of 16 keys a row, where four vary), and the CTEs that insert them (`capped`:
    each only if the tenant's cap, asked first, reserved it)."""
    varying, alike = keys
    cols, source = _recordset(_LEDGER, varying, params, defaults=False)
    columns = list(cols.keys)
    selected = [f"v.{_Q(k)}" for k in cols.keys]
    alike_cols = None
    if alike or _defaults(_LEDGER, varying):  # (rows of one swarm: its id at least is alike)
        alike_cols, alike_source = _recordset(_LEDGER, alike, params, defaults=True,
                                              given=varying, alias="a")
        columns += alike_cols.keys
        selected += [f"a.{_Q(k)}" for k in alike_cols.keys]
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
    ctes.append(f"new_ledger AS (INSERT INTO {_Q(_LEDGER.name)} "
                f"({', '.join(map(_Q, columns))}) "
                f"SELECT {', '.join(selected)} FROM {source})")
    return cols, alike_cols, ctes


@dataclass(frozen=True, slots=True)
class _Columns:
    """A document's columns, sorted once per statement shape for `_document`: the keys sent
    as they are, those sent through their column's bind processor, and the Python-side
    defaults of the columns no row names (called once per document: a created_at is the
    statement's). Rebuilding the three per document was ~10 % of a 1-agent creation's
    statement."""

    keys: tuple[str, ...]  # every column, in the recordset's order
    direct: tuple[str, ...]
    processed: tuple[tuple[str, Callable[[Any], Any]], ...]
    defaults: tuple[tuple[str, Callable[[], Any]], ...]


def _document(rows: Sequence[Mapping[str, Any]], cols: _Columns) -> str:
    """The rows as one JSON array of objects, each value as SQLAlchemy would bind it (a JSON
    column's as it is); NaN and infinities are written as such, which PostgreSQL refuses
    (as it refuses them in JSON columns when bound one by one)."""
    direct, processed = cols.direct, cols.processed
    fixed = {key: default() for key, default in cols.defaults}
    doc: list[dict[str, Any]] = []
    for row in rows:
        out = {key: row[key] for key in direct}
        for key, process in processed:  # every processor maps None to None: not called
            out[key] = None if (value := row[key]) is None else process(value)
        out.update(fixed)
        doc.append(out)
    return _encode(doc)


def _encode(value: Any) -> str:
    return pydantic_core.to_json(value, inf_nan_mode="constants").decode()


@functools.cache  # a handful of shapes: which tables have rows, with which keys
def _statement(shape: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple[str, list[_Columns]]:
    params = iter(range(3, 100))  # $1 is the owner, $2 the swarms' ids
    # the swarms' rows locked in id order first, as every statement that locks several takes
    # them (leases._held_in_order): the UPDATE's own scan locks them in its plan's order.
    # One probe per id, its row locked as the ordered ids are walked: the plan PostgreSQL
    # keeps for this prepared statement is made once, on the tables as they are then (new,
    # on a new database); `WHERE id = ANY($2)` was planned there as a scan of the whole
    # table, kept while the table grew (~0.7 ms a commit at 2,650 swarms, where autovacuum
    # never analyzes; bench/RESULTS.md, session 30). A lateral probe by id is planned as a
    # primary-key lookup at any size.
    ctes: list[str] = [
        "locked AS (SELECT l.id FROM (SELECT id FROM unnest($2::varchar[]) AS k(id) "
        f"ORDER BY id) AS k CROSS JOIN LATERAL (SELECT id FROM {_Q(_SWARMS.name)} "
        "WHERE id = k.id AND lease_owner = $1 FOR UPDATE) AS l)"]
    columns: list[_Columns] = []
    for name, keys in shape:
        table = _TABLES[name]
        cols, source = _recordset(table, keys, params, defaults=name not in ("sw", "st"))
        columns.append(cols)
        ctes.append(f"{name} AS ({_dml(name, table, cols.keys, source)})")
    return "WITH " + ",\n".join(ctes) + "\nSELECT id FROM sw", columns


def _recordset(table: Table, keys: tuple[str, ...], params: Iterator[int], *, defaults: bool,
               given: tuple[str, ...] = (), alias: str = "v") -> tuple[_Columns, str]:
    """The columns the rows' keys (and, for an insert, the defaults of the columns neither they
    nor `given`, another document's keys, name) bind, and `json_to_recordset($n::json) AS
    v(key type, …)` over their document (`alias` for v)."""
    filled = _defaults(table, keys + given) if defaults else {}
    keys = (*keys, *filled)
    types = [_column(table, key).type for key in keys]
    direct: list[str] = []
    processed: list[tuple[str, Callable[[Any], Any]]] = []
    for key, type_ in zip(keys, types, strict=True):
        if key in filled:
            continue
        # a JSON column's value goes into the document as it is (a content column's sealed
        # first: a JSON string); every other through its bind processor (a sealed one's seals)
        process = (seal_json if isinstance(type_, SealedJSON)
                   else None if isinstance(type_.dialect_impl(_DIALECT), JSON)
                   else bind_processor(type_, _DIALECT))
        if process is None:
            direct.append(key)
        else:
            processed.append((key, process))
    cols = _Columns(keys, tuple(direct), tuple(processed), tuple(filled.items()))
    defs = ", ".join(f"{_Q(key)} {type_.compile(dialect=_DIALECT)}"
                     for key, type_ in zip(keys, types, strict=True))
    return cols, f"json_to_recordset(${next(params)}::json) AS {alias}({defs})"


def _defaults(table: Table, keys: tuple[str, ...]) -> dict[str, Callable[[], Any]]:
    """The Python-side defaults SQLAlchemy would fill in for columns the rows leave out (one
    value per statement: a created_at is the same for the rows committed together)."""
    out: dict[str, Callable[[], Any]] = {}
    for col in table.c:
        default = col.default
        if col.key in keys or default is None or not hasattr(default, "arg"):
            continue
        arg = default.arg
        out[col.key] = (functools.partial(arg, None) if callable(arg)  # takes a context
                        else functools.partial(_same, arg))
    return out


def _column(table: Table, key: str) -> Column[Any]:
    """The column a row key binds: itself, or (`name_`, `position_`, `swarm_id_`, `epoch`)
    its match."""
    if key == "epoch":
        return _SWARMS.c.lease_epoch
    return table.c[key.removesuffix("_")]


def _dml(name: str, table: Table, keys: Sequence[str], source: str) -> str:
    t = _Q(table.name)
    if name == "sw":
        sets = ", ".join(f"{_Q(k)} = v.{_Q(k)}" for k in keys if k not in ("id", "epoch"))
        # driven by the locked ids: each row found by its primary key whatever the plan saw
        # when it was made (`s.id = v.id` alone, against a new table, took the (tenant,
        # created_at, id) index, read whole as the table grew; `s.id = ANY($2)` against
        # 20,000 analyzed swarms, a scan of the table: bench/RESULTS.md, sessions 9 and 30)
        return (f"UPDATE {t} AS s SET {sets} FROM locked AS l JOIN {source} ON v.id = l.id "
                "WHERE s.id = l.id AND s.lease_epoch = v.epoch AND s.lease_owner = $1 "
                f"RETURNING s.id, pg_notify('{CHANGED}', s.id || ' ' || s.status)")
    if name == "st":
        sets = ", ".join(f"{_Q(k)} = v.{_Q(k)}" for k in keys if not k.endswith("_"))
        # position too, though (swarm_id, name) is unique: with some statistics and without
        # any (a new database) the planner took the (swarm_id, position) index for a lookup
        # by name, reading half a swarm's rows per row updated (bench/RESULTS.md, session 9;
        # tests/perf/test_group_commit_plan.py); with the position given, either index finds it
        return (f"UPDATE {t} AS t SET {sets} FROM {source} WHERE t.swarm_id = v.swarm_id_ "
                "AND t.position = v.position_ AND t.name = v.name_ "
                "AND v.swarm_id_ IN (SELECT id FROM sw)")
    cols = ", ".join(_Q(k) for k in keys)
    insert = (f"INSERT INTO {t} ({cols}) SELECT * FROM {source} "
              "WHERE v.swarm_id IN (SELECT id FROM sw) ")
    if name != "ledger":
        return insert + "ON CONFLICT DO NOTHING"
    # a row written ahead as in_flight is settled by its answer, a settled one never again
    sets = ", ".join(f"{_Q(k)} = EXCLUDED.{_Q(k)}" for k in LEDGER_SETTLED)
    return (insert + f"ON CONFLICT (idempotency_key, attempt) DO UPDATE SET {sets} "
            f"WHERE {t}.outcome = '{AttemptOutcome.in_flight}'")


def _same(value: Any) -> Any:
    return value
