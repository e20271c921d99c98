"""Rows as one JSON document, read by PostgreSQL's `json_to_recordset`: the documents and the
recordsets of the statements that write many rows in one (`commit_statement`,
`creation_statement`).

Why JSON and not column arrays (`unnest($n::type[], …)`, the first form): asyncpg encodes an
array element by element, with ABC `isinstance` checks on each: a commit of 100 writes (a
subtask's state, its ledger row, its event) costs 3.4 to 4.3 ms of client CPU to build and send
as arrays, 2.5 to 2.8 ms as documents (pydantic-core writes them); PostgreSQL's time is the
same. Values are
what SQLAlchemy would bind (the columns' bind processors), but for JSON columns, which go into
the document as they are: a None there is SQL NULL (the ORM writes JSON `null`; both read back
as None).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic_core
from sqlalchemy import JSON, Column, Table
from sqlalchemy.dialects import postgresql

from app.db.base import table_of
from app.db.batch import bind_processor
from app.db.sealed import SealedJSON, seal_json
from app.db.tables import Swarm

DIALECT = postgresql.asyncpg.dialect()  # type: ignore[no-untyped-call]
quote = DIALECT.identifier_preparer.quote
_SWARMS = table_of(Swarm)


def json_param(column: Column[Any], value: Any) -> str | None:
    """A JSON column's value as its own parameter's text (None: SQL NULL, as in a document);
    a content column's sealed first, as `recordset` seals it in a document."""
    if value is None:
        return None
    return encode(seal_json(value) if isinstance(column.type, SealedJSON) else value)


@dataclass(frozen=True, slots=True)
class Columns:
    """A document's columns, sorted once per statement shape for `document`: the keys sent
    as they are, those sent through their column's bind processor, and the Python-side
    defaults of the columns no row names (called once per document: a created_at is the
    statement's). Rebuilding the three per document was ~10 % of a 1-agent creation's
    statement."""

    keys: tuple[str, ...]  # every column, in the recordset's order
    direct: tuple[str, ...]
    processed: tuple[tuple[str, Callable[[Any], Any]], ...]
    defaults: tuple[tuple[str, Callable[[], Any]], ...]


def document(rows: Sequence[Mapping[str, Any]], cols: Columns) -> str:
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
    return encode(doc)


def encode(value: Any) -> str:
    return pydantic_core.to_json(value, inf_nan_mode="constants").decode()


def recordset(table: Table, keys: tuple[str, ...], params: Iterator[int], *, defaults: bool,
               given: tuple[str, ...] = (), alias: str = "v") -> tuple[Columns, str]:
    """The columns the rows' keys (and, for an insert, the defaults of the columns neither they
    nor `given`, another document's keys, name) bind, and `json_to_recordset($n::json) AS
    v(key type, …)` over their document (`alias` for v)."""
    filled = defaults_of(table, keys + given) if defaults else {}
    keys = (*keys, *filled)
    types = [column_of(table, key).type for key in keys]
    direct: list[str] = []
    processed: list[tuple[str, Callable[[Any], Any]]] = []
    for key, type_ in zip(keys, types, strict=True):
        if key in filled:
            continue
        # a JSON column's value goes into the document as it is (a content column's sealed
        # first: a JSON string); every other through its bind processor (a sealed one's seals)
        process = (seal_json if isinstance(type_, SealedJSON)
                   else None if isinstance(type_.dialect_impl(DIALECT), JSON)
                   else bind_processor(type_, DIALECT))
        if process is None:
            direct.append(key)
        else:
            processed.append((key, process))
    cols = Columns(keys, tuple(direct), tuple(processed), tuple(filled.items()))
    defs = ", ".join(f"{quote(key)} {type_.compile(dialect=DIALECT)}"
                     for key, type_ in zip(keys, types, strict=True))
    return cols, f"json_to_recordset(${next(params)}::json) AS {alias}({defs})"


def defaults_of(table: Table, keys: tuple[str, ...]) -> dict[str, Callable[[], Any]]:
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


def column_of(table: Table, key: str) -> Column[Any]:
    """The column a row key binds: itself, or (`name_`, `position_`, `swarm_id_`, `epoch`)
    its match."""
    if key == "epoch":
        return _SWARMS.c.lease_epoch
    return table.c[key.removesuffix("_")]


def _same(value: Any) -> Any:
    return value
