"""Column types that behave the same on PostgreSQL and SQLite."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, TypeVar

from sqlalchemy import JSON, BigInteger, DateTime, Dialect, Numeric, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator, TypeEngine

from app.pricing import USD_QUANTUM

# SQLite has no exact decimal: money lives there as an integer count of USD_QUANTUM (1e-12 USD),
# which SUM()s exactly; PostgreSQL keeps NUMERIC.
_SCALE = Decimal(1) / USD_QUANTUM

JSONType = JSON().with_variant(JSONB(), "postgresql")


class Money(TypeDecorator[Decimal]):
    """Exact USD amounts: NUMERIC(24,12) on Postgres, integer pico-dollars on SQLite."""

    impl = Numeric(24, 12)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(BigInteger())
        return dialect.type_descriptor(Numeric(24, 12, asdecimal=True))

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if type(value) is not Decimal:  # a Decimal already needs no copy (the engine's own)
            value = Decimal(value)
        if dialect.name == "sqlite":
            return int((value * _SCALE).to_integral_value())
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        if value is None:
            return None
        if dialect.name == "sqlite":
            return Decimal(int(value)) / _SCALE
        return Decimal(value)


E = TypeVar("E", bound=StrEnum)


class StatusColumn(TypeDecorator[E]):
    """A StrEnum stored as its text (VARCHAR(16), as the migrations made it; a swarm's status
    24), loaded back as the enum: a status read from the database is typed like one set in
    memory."""

    impl = String  # a class: TypeDecorator builds it with the length given
    cache_ok = True

    def __init__(self, enum: type[E], length: int = 16) -> None:
        super().__init__(length)
        self.enum = enum
        self._members: dict[str, E] = dict(enum._value2member_map_)
        # a member and its text are equal keys: either finds the text (the enum's call and
        # `.value` were ~1 us a bind, ~50 of them in a group commit of 50 results)
        self._texts: dict[str, str] = {m.value: str(m.value) for m in enum}

    def process_bind_param(self, value: E | str | None, dialect: Dialect) -> str | None:
        if value is None:
            return None
        return self._texts.get(value) or self.enum(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> E | None:
        # the members by value, not the enum's call: a tenth of the cost, per row and column
        return None if value is None else self._members.get(value) or self.enum(value)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps; naive datetimes are a bug and are refused."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime; use datetime.now(UTC)")
        if dialect.name == "sqlite":
            return value.astimezone(UTC).replace(tzinfo=None)
        return value if value.tzinfo is UTC else value.astimezone(UTC)  # utcnow()'s as it is

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)
