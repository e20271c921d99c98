"""The field types of a request: JSON numbers, storable text, names, models, tool selectors,
schemas, and what each accepts."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
# a budget as a string: a plain positive decimal, as JSON spells numbers (Decimal would also
# read "1_000", non-ASCII digits, "Infinity"); `gt`, `max_digits`, `decimal_places` stay the
# validator's (a pattern cannot say them)
BUDGET_PATTERN = r"^\s*\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\s*$"
METADATA_MAX_DEPTH = 32


def _no_nul(v: str) -> str:
    # PostgreSQL text and jsonb cannot store U+0000: refuse it here rather than answer a 500
    if "\x00" in v:
        raise ValueError("must not contain NUL (U+0000) characters")
    return v


def _storable(v: str) -> str:
    """What every database stores: no NUL, and no lone surrogate (UTF-8 cannot encode one)."""
    _no_nul(v)
    try:
        v.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid unicode (no lone surrogates)") from None
    return v


def json_value(v: Any, depth: int) -> None:
    if depth > METADATA_MAX_DEPTH:
        raise ValueError(f"nested deeper than {METADATA_MAX_DEPTH} levels")
    if isinstance(v, str):
        _storable(v)
    elif isinstance(v, float) and not math.isfinite(v):
        raise ValueError("numbers must be finite (no NaN or Infinity)")
    elif isinstance(v, dict):
        for k, item in v.items():
            json_value(k, depth)
            json_value(item, depth + 1)
    elif isinstance(v, list):
        for item in v:
            json_value(item, depth + 1)


def _json_number(v: Any) -> Any:
    """A number as the schema says: pydantic's lax mode took `true` for 1 and `"8"` for 8
    (`"max_attempts": true` ran one attempt). An integral float stays an integer, as JSON
    Schema has it (`8.0`)."""
    if isinstance(v, bool | str):
        raise PydanticCustomError(
            "number_type", "Input should be a JSON number, not {kind}",
            {"kind": "a boolean" if isinstance(v, bool) else "a string"})
    return v


def budget_schema(schema: dict[str, Any]) -> None:
    """The string branch of the budget's schema says which strings are read."""
    for branch in schema.get("anyOf", []):
        if branch.get("type") == "string":
            branch["pattern"] = BUDGET_PATTERN


def retry_budget_schema(schema: dict[str, Any]) -> None:
    """A retry's budget: as any, but never null (None is only its absence)."""
    budget_schema(schema)
    schema["anyOf"] = [b for b in schema["anyOf"] if b.get("type") != "null"]


# numbers of a request: JSON numbers only (a budget may also be a decimal string: money)
Int = Annotated[int, BeforeValidator(_json_number)]
Number = Annotated[float, BeforeValidator(_json_number)]

Text = Annotated[str, AfterValidator(_storable)]
AgentName = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
MaxTokens = Annotated[Int, Field(ge=1, le=128_000)]
Temperature = Annotated[Number, Field(ge=0, le=2)]
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=64),
                      AfterValidator(_storable)]
MAX_FALLBACK_MODELS = 8


def _distinct_models(v: list[str]) -> list[str]:
    seen: set[str] = set()
    for i, name in enumerate(v):
        if name in seen:
            raise PydanticCustomError("duplicate_model", "{detail}", {
                "detail": f"model {name!r} is listed twice (item {i})"})
        seen.add(name)
    return v


# a model, or models in order of preference: each next one is tried when the one before is
# down (its attempts spent on retryable failures; SPEC §15)
ModelList = Annotated[list[ModelName], Field(min_length=1, max_length=MAX_FALLBACK_MODELS),
                      AfterValidator(_distinct_models)]
_ONE_MODEL: TypeAdapter[str] = TypeAdapter(ModelName)
_MODEL_LIST: TypeAdapter[list[str]] = TypeAdapter(ModelList)


def _model_choice(v: Any, _handler: Any) -> str | list[str]:
    """A name or a list, validated as the one it is: a union's error would name both
    branches (`model.function-after[...]`) where the client wrote `model`."""
    adapter: TypeAdapter[Any] = _MODEL_LIST if isinstance(v, list) else _ONE_MODEL
    try:
        chosen: str | list[str] = adapter.validate_python(v)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PydanticCustomError(first["type"], "{detail}", {
            "detail": f"item {where}: {first['msg']}" if where else first["msg"]}) from None
    return chosen


ModelChoice = Annotated[ModelName | ModelList, WrapValidator(_model_choice), Field(
    description="a model, or a list of models to fall back on in order",
    examples=["kimi-k2.5", ["kimi-k2.5", "deepseek-v3.2"]])]


def model_chain(value: str | list[str]) -> list[str]:
    """A model field's models in order: one name, or the list to fall back on."""
    return [value] if isinstance(value, str) else list(value)


# `server` (all its tools) or `server.tool` (one; MCP tool names are 1-128 of [A-Za-z0-9_.-])
ToolSelector = Annotated[str, StringConstraints(
    pattern=r"^[A-Za-z0-9_-]{1,48}(\.[A-Za-z0-9_.\-]{1,128})?$")]
ToolSelectors = Annotated[list[ToolSelector], Field(min_length=1, max_length=200)]
# a JSON Schema (draft 2020-12), checked when the swarm is built (422 `invalid_schema`)
OutputSchema = Annotated[dict[str, Any] | None, Field(
    default=None,
    description="a JSON Schema (draft 2020-12, at most 64 KiB) the answer must be valid for: "
                "asked of the gateway as response_format json_schema, parsed and repaired "
                "once if it is not")]
