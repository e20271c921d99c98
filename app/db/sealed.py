"""The content columns' types (SPEC §16): encrypted at rest when SWARM_ENCRYPTION_KEYS is set,
so no query, repository or hot-path statement knows. Every path that binds or reads such a
column goes through `seal_text`/`open_text` (text) or `seal_json`/`open_json` (JSON): the
ORM and Core through the types below, the group commit's documents (app/db/recordsets.py)
and executemany plans (app/db/batch.py) through the same bind processors.

A value written while no key was set stays plaintext and reads as it is (a table is mixed
while a rollout or `swarm-api reencrypt` runs); a sealed value read with no key configured, or
with none that opens it, raises `SealError`. A JSON column holds a sealed value as a JSON
string, so the column keeps its type and no migration is needed. The keys are the process's
(`use_sealer`, from the settings at start): SQLAlchemy's types are built once, at import."""

from __future__ import annotations

from typing import Any

import pydantic_core
from sqlalchemy import JSON, Dialect, Text
from sqlalchemy.types import TypeDecorator, TypeEngine

from app.crypto import MARK, Sealer, SealError
from app.db.types import JSONType


class _Keys:
    sealer: Sealer | None = None


def use_sealer(sealer: Sealer | None) -> None:
    """The keys content is sealed and opened with, from now on, in this process."""
    _Keys.sealer = sealer


def active_sealer() -> Sealer | None:
    return _Keys.sealer


def _opener() -> Sealer:
    sealer = _Keys.sealer
    if sealer is None:
        raise SealError("the database holds encrypted content and SWARM_ENCRYPTION_KEYS "
                        "is unset")
    return sealer


def seal_text(value: str | None) -> str | None:
    sealer = _Keys.sealer
    return value if sealer is None or value is None else sealer.seal(value)


def open_text(value: str | None) -> str | None:
    if value is None or not value.startswith(MARK):
        return value
    return _opener().open(value)


def seal_json(value: Any) -> Any:
    """A JSON column's value as it is bound: the value itself, or with a key its JSON text
    sealed (a JSON string). None stays None (the column's null, whichever it writes)."""
    sealer = _Keys.sealer
    if sealer is None or value is None:
        return value
    return sealer.seal(pydantic_core.to_json(value, inf_nan_mode="constants").decode())


def open_json(value: Any) -> Any:
    if type(value) is not str or not value.startswith(MARK):
        return value
    return pydantic_core.from_json(_opener().open(value))


class SealedText(TypeDecorator[str]):
    """TEXT whose values are encrypted when keys are configured."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return seal_text(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        return open_text(value)


class SealedJSON(TypeDecorator[Any]):
    """JSON (JSONB on PostgreSQL) whose values are encrypted when keys are configured."""

    impl = JSON
    cache_ok = True
    should_evaluate_none = True  # None is JSON null, as the plain JSON columns write it

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(JSONType.dialect_impl(dialect))

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return seal_json(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return open_json(value)
