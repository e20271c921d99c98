"""The declarative base every table of app/db shares, and two helpers on its mapped classes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import BigInteger, Integer, MetaData, Table
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

BigId = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER only


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def table_of(model: type[Base]) -> Table:
    """A mapped class's Core table (typed: `__table__` is a FromClause to mypy)."""
    return cast(Table, model.__table__)


def column_values(row: Base, columns: Sequence[str]) -> dict[str, Any]:
    """The named attributes of a mapped (or live) object, read from its instance dict where
    they are loaded (an instrumented getattr costs ~10x more: the engine and creation read
    every column of every written subtask), else through getattr."""
    state = row.__dict__
    return {c: state[c] if c in state else getattr(row, c) for c in columns}
