"""The group commit as one PostgreSQL statement: each table's rows sent as one JSON document
(`recordsets`), read into set-based UPDATEs and INSERTs, chained as CTEs behind the fencing
UPDATE of the swarms' rows, run in autocommit (one statement is one transaction).

Row by row, a group commit of ~100 writes is ~8 round trips (BEGIN, the lock, one pipelined
executemany per table, COMMIT) and ~400 single-row statements on the server, and every subtask
waits for one before its call is sent (its ledger row is written ahead). Here it is one round
trip and one statement per table.

Semantics kept from `writes.apply_writes` (SQLite runs that): a swarm is written only
while its row still carries the writer's (epoch, owner) — the UPDATE checks it, and every
other table's rows are filtered on the swarm ids it RETURNs (RETURNING is how data-modifying
CTEs see each other); NOTIFY swarm_changed per written swarm; inserts ignore rows already
there and the ledger settles only `in_flight` rows, so a statement retried after a lost
outcome changes nothing. What one statement cannot do as a sequence of them is see its own
changes or touch a row twice, so rows are merged first: the last state of a subtask wins, and
one inserted in the same batch is inserted in that state.

The tenant caps' settlements the writes carry (`SwarmWrite.settles`) are CTEs of the same
statement (`_settling`), filtered on the swarms written like every other table's rows: a
settlement commits with the ledger row it settles or not at all, with no round trip of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table

from app.db.base import table_of
from app.db.changes import SwarmWrite
from app.db.columns import LEDGER_SETTLED
from app.db.notify import CHANGED
from app.db.recordsets import Columns, document, encode, quote, recordset
from app.db.tables import (
    AuditRow,
    Event,
    GatewayCall,
    Subtask,
    Swarm,
    ToolCall,
    TranscriptMessage,
    Webhook,
)
from app.db.tenant_tables import TenantDailyReservation, TenantDailySpend, TenantQueue
from app.states import AttemptOutcome

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
    settles = [ts.row(w.swarm_id) for w in writes for ts in w.settles]
    sql, columns = _statement(shape, bool(settles))
    args: list[Any] = [owner, [row["id"] for row in swarms]]
    for (_, rows), cols in zip(parts, columns, strict=True):
        args.append(document(rows, cols))
    if settles:
        args.append(encode(settles))
    return Statement(sql, tuple(args), frozenset(batch.swarms))


@functools.cache  # a handful of shapes: which tables have rows, with which keys
def _statement(shape: tuple[tuple[str, tuple[str, ...]], ...], settles: bool = False
               ) -> tuple[str, list[Columns]]:
    params = iter(range(3, 100))  # $1 is the owner, $2 the swarms' ids
    # the swarms' rows locked in id order first, as every statement that locks several takes
    # them (leases._held_in_order): the UPDATE's own scan locks them in its plan's order.
    # One probe per id, its row locked as the ordered ids are walked: the plan PostgreSQL
    # keeps for this prepared statement is made once, on the tables as they are then (new,
    # on a new database); `WHERE id = ANY($2)` was planned there as a scan of the whole
    # table, kept while the table grew (~0.7 ms a commit at 2,650 swarms, where autovacuum
    # never analyzes). A lateral probe by id is planned as a
    # primary-key lookup at any size.
    ctes: list[str] = [
        "locked AS (SELECT l.id FROM (SELECT id FROM unnest($2::varchar[]) AS k(id) "
        f"ORDER BY id) AS k CROSS JOIN LATERAL (SELECT id FROM {quote(_SWARMS.name)} "
        "WHERE id = k.id AND lease_owner = $1 FOR UPDATE) AS l)"]
    columns: list[Columns] = []
    for name, keys in shape:
        table = _TABLES[name]
        cols, source = recordset(table, keys, params, defaults=name not in ("sw", "st"))
        columns.append(cols)
        ctes.append(f"{name} AS ({_dml(name, table, cols.keys, source)})")
    if settles:
        ctes += _settling(next(params))
    return "WITH " + ",\n".join(ctes) + "\nSELECT id FROM sw", columns


_TODAY = "CAST(timezone('UTC', now()) AS date)"


def _settling(param: int) -> list[str]:
    """The tenant caps' settlements of the written swarms (`SwarmWrite.settles`), as migration
    0014's `tenant_cap_apply` makes them: each reservation deleted adds its cost to the day it
    was made on, and one older than yesterday (a cleanup may have taken it) adds it anyway; a
    statement retried after its answer was lost adds nothing twice. The days' rows are locked
    first, today's before older ones (`tenant_cap_apply`'s order: its cleanup deletes old
    reservations while it holds today's row), then the reservations."""
    spend, held = quote(table_of(TenantDailySpend).name), quote(
        table_of(TenantDailyReservation).name)
    return [
        "cap_settled AS (SELECT c.* FROM json_to_recordset("
        f"${param}::json) AS c(swarm_id varchar, tenant varchar, id varchar, day date, "
        "actual numeric) WHERE c.swarm_id IN (SELECT id FROM sw))",
        f"cap_days AS MATERIALIZED (SELECT d.tenant FROM {spend} AS d JOIN (SELECT DISTINCT "
        "tenant, day FROM cap_settled) AS k ON d.tenant = k.tenant AND d.day = k.day "
        f"ORDER BY d.tenant, d.day = {_TODAY} DESC, d.day FOR UPDATE OF d)",
        f"cap_gone AS (DELETE FROM {held} AS r USING cap_settled AS c WHERE r.id = c.id "
        "AND r.tenant = c.tenant AND (SELECT count(*) FROM cap_days) >= 0 "
        "RETURNING r.id, r.tenant, r.day, c.actual)",
        f"cap_spent AS (INSERT INTO {spend} AS s (tenant, day, spent_usd) "
        "SELECT tenant, day, sum(actual) FROM (SELECT tenant, day, actual FROM cap_gone "
        "UNION ALL SELECT tenant, day, actual FROM cap_settled "
        f"WHERE day < {_TODAY} - 1 AND id NOT IN (SELECT id FROM cap_gone)) AS m "
        "GROUP BY tenant, day ORDER BY tenant, day "
        "ON CONFLICT (tenant, day) DO UPDATE SET spent_usd = s.spent_usd + EXCLUDED.spent_usd)"]


def _dml(name: str, table: Table, keys: Sequence[str], source: str) -> str:
    t = quote(table.name)
    if name == "sw":
        sets = ", ".join(f"{quote(k)} = v.{quote(k)}" for k in keys if k not in ("id", "epoch"))
        # driven by the locked ids: each row found by its primary key whatever the plan saw
        # when it was made (`s.id = v.id` alone, against a new table, took the (tenant,
        # created_at, id) index, read whole as the table grew; `s.id = ANY($2)` against
        # 20,000 analyzed swarms, a scan of the table)
        return (f"UPDATE {t} AS s SET {sets} FROM locked AS l JOIN {source} ON v.id = l.id "
                "WHERE s.id = l.id AND s.lease_epoch = v.epoch AND s.lease_owner = $1 "
                f"RETURNING s.id, pg_notify('{CHANGED}', s.id || ' ' || s.status)")
    if name == "st":
        sets = ", ".join(f"{quote(k)} = v.{quote(k)}" for k in keys if not k.endswith("_"))
        # position too, though (swarm_id, name) is unique: with some statistics and without
        # any (a new database) the planner took the (swarm_id, position) index for a lookup
        # by name, reading half a swarm's rows per row updated; with the position given, either
        # index finds it (tests/perf/test_group_commit_plan.py)
        return (f"UPDATE {t} AS t SET {sets} FROM {source} WHERE t.swarm_id = v.swarm_id_ "
                "AND t.position = v.position_ AND t.name = v.name_ "
                "AND v.swarm_id_ IN (SELECT id FROM sw)")
    cols = ", ".join(quote(k) for k in keys)
    insert = (f"INSERT INTO {t} ({cols}) SELECT * FROM {source} "
              "WHERE v.swarm_id IN (SELECT id FROM sw) ")
    if name != "ledger":
        return insert + "ON CONFLICT DO NOTHING"
    # a row written ahead as in_flight is settled by its answer, a settled one never again
    sets = ", ".join(f"{quote(k)} = EXCLUDED.{quote(k)}" for k in LEDGER_SETTLED)
    return (insert + f"ON CONFLICT (idempotency_key, attempt) DO UPDATE SET {sets} "
            f"WHERE {t}.outcome = '{AttemptOutcome.in_flight}'")
