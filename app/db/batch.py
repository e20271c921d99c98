"""executemany for the group commit's hot statements, without SQLAlchemy's per-row assembly.

`conn.execute(stmt, rows)` rebuilds every row's parameters generically (a dict of every bind,
defaults, then processors, then positional order), several times the CPU of the driver's own
encoding; at ~7 rows per subtask that shows in the engine's CPU. Here each statement is
compiled once per dialect and key set; a row becomes one tuple through the same bind processors
SQLAlchemy would apply (JSON, Money, enums, UTC times), and goes to the driver through
`exec_driver_sql` (same connection, transaction and error wrapping). A statement this cannot
reproduce exactly (Python-side defaults, a bind no row names) goes through `conn.execute`
unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from sqlalchemy import JSON, Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeEngine

# (name in the row, or None for a constant; the bind processor or None; the constant)
_Param = tuple[str | None, Callable[[Any], Any] | None, Any]
_Plan = tuple[str, tuple[_Param, ...]] | None
_PLANS: dict[tuple[Executable, str, tuple[str, ...]], _Plan] = {}


def _plan(stmt: Executable, conn: AsyncConnection, keys: tuple[str, ...]) -> _Plan:
    dialect = conn.dialect
    compiled = cast(ClauseElement, stmt).compile(dialect=dialect, column_keys=list(keys))
    if not isinstance(compiled, SQLCompiler) or compiled.positiontup is None \
            or compiled.insert_prefetch or compiled.update_prefetch:
        return None  # defaults computed per row: SQLAlchemy's own path
    names = compiled.positiontup
    params: list[_Param] = []
    present = set(keys)
    for name in names:
        bind = compiled.binds[name]
        process = bind_processor(bind.type, dialect)
        if name in present:
            params.append((name, process, None))
        elif bind.callable is None and not bind.required:  # a literal of the statement
            params.append((None, None, process(bind.value) if process else bind.value))
        else:
            return None
    return compiled.string, tuple(params)


def bind_processor(type_: TypeEngine[Any], dialect: Dialect) -> Callable[[Any], Any] | None:
    """What SQLAlchemy applies to a value of this type before the driver sees it."""
    impl = type_.dialect_impl(dialect)
    process: Callable[[Any], Any] | None = impl.bind_processor(dialect)
    if process is not None and isinstance(impl, JSON):
        process = _json_shortcuts(process)
    return process


def _json_shortcuts(process: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A JSON column's processor, with its two commonest values (None, []) encoded once: most
    rows' `error`, `depends_on` and `tools` (a json.dumps each was a tenth of inserting a wide
    swarm's subtasks)."""
    null, empty = process(None), process([])

    def encode(value: Any) -> Any:
        if value is None:
            return null
        if value == [] and isinstance(value, list):
            return empty
        return process(value)

    return encode


async def executemany(conn: AsyncConnection, stmt: Executable,
                      rows: Sequence[dict[str, Any]]) -> None:
    """`conn.execute(stmt, rows)` for rows that all have the first row's keys."""
    keys = tuple(rows[0])
    # keyed by the statement itself (held here): callers pass long-lived statements
    slot = (stmt, conn.dialect.name, keys)
    if slot not in _PLANS:
        _PLANS[slot] = _plan(stmt, conn, keys)
    plan = _PLANS[slot]
    if plan is None:
        await conn.execute(stmt, list(rows))
        return
    sql, params = plan
    await conn.exec_driver_sql(sql, [
        tuple((p(row[n]) if p else row[n]) if n is not None else v for n, p, v in params)
        for row in rows])
