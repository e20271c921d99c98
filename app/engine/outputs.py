"""Structured outputs (SPEC §15), the pure part: an `output_schema` checked when the swarm is
built, the `response_format` that asks for it, and an answer parsed and validated — taken
whole, else the one JSON value of a code fence or of surrounding prose. No IO; the calls of
the repair ladder are app/engine/repair.py's."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import Unresolvable

from app.engine.schema_regex import META_FORMATS, LinearValidator, PatternRefused
from app.engine.subtask_rows import SYNTHESIZER
from app.gateway.errors import GatewayRejected

SCHEMA_MAX_BYTES = 64 * 1024
SCHEMA_MAX_DEPTH = 32
JSON_OBJECT: dict[str, Any] = {"type": "json_object"}
ERRORS_SHOWN = 8  # validation errors told in a repair turn and kept on the failed subtask
ERROR_CHARS = 300
_PROSE_STARTS = 64  # JSON starts tried in prose: unclosed brackets cost a parse to the end each
_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)
_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]")
SCHEMA_HEAD = "Answer with one JSON value valid for this JSON Schema, and nothing else:"

# no registry that retrieves: a `$ref` outside the schema itself is never fetched
_REGISTRY: Registry[Any] = Registry()


class SchemaInvalid(ValueError):
    """Why an `output_schema` cannot be used."""


def check_schema(schema: Any) -> None:
    """A JSON Schema object (draft 2020-12) of at most 64 KiB, nested at most 32 levels,
    whose references stay inside it; raises SchemaInvalid."""
    if not isinstance(schema, dict):
        raise SchemaInvalid("must be a JSON Schema object")
    _walk(schema, 0)  # first: the depth bound keeps the encoder below off deep recursion
    text = _text_of(schema)
    size = len(text.encode("utf-8", "replace"))
    if size > SCHEMA_MAX_BYTES:
        raise SchemaInvalid(f"is {size} bytes; at most {SCHEMA_MAX_BYTES} are allowed")
    if (why := _against_metaschema(text)) is not None:
        raise SchemaInvalid(why)


def _text_of(schema: dict[str, Any]) -> str:
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


# Checking a schema against the 2020-12 metaschema costs milliseconds (its vocabularies are
# reached through $dynamicRef): agents of one swarm, and swarms of one client, share schemas
@functools.lru_cache(maxsize=256)
def _against_metaschema(text: str) -> str | None:
    try:
        # `format: regex` (pattern, patternProperties' names) asserted by RE2
        Draft202012Validator.check_schema(json.loads(text), format_checker=META_FORMATS)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        at = f" (at {where})" if where else ""
        if isinstance(exc.cause, PatternRefused):
            return f"{exc.cause}{at}"
        return f"is not a valid JSON Schema: {exc.message[:ERROR_CHARS]}{at}"
    return None


@functools.lru_cache(maxsize=256)
def _validator(text: str) -> Validator:
    return LinearValidator(json.loads(text), registry=_REGISTRY)


def _walk(value: Any, depth: int) -> None:
    if depth > SCHEMA_MAX_DEPTH:
        raise SchemaInvalid(f"is nested deeper than {SCHEMA_MAX_DEPTH} levels")
    if isinstance(value, str):
        if "\x00" in value:
            raise SchemaInvalid("must not contain NUL (U+0000) characters")
        try:
            value.encode()
        except UnicodeEncodeError:
            raise SchemaInvalid("must be valid unicode (no lone surrogates)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _walk(key, depth)
            _check_reference(key, item)
            _walk(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _walk(item, depth + 1)


def _check_reference(key: str, item: Any) -> None:
    """References stay inside the schema: none is fetched."""
    if key in ("$ref", "$dynamicRef") and not str(item).startswith("#"):
        raise SchemaInvalid(f"{key} {item!r} points outside the schema (only '#...' "
                            "references are resolved)")


def schemas_of(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Subtask name -> the output schema its answer must be valid for: each agent's, and the
    synthesizer's `synthesis.output_schema` (planned workers and compressors have none)."""
    out = {a["name"]: a["output_schema"] for a in spec.get("agents") or ()
           if isinstance(a.get("output_schema"), dict)}
    synthesis = (spec.get("synthesis") or {}).get("output_schema")
    if isinstance(synthesis, dict):
        out[SYNTHESIZER] = synthesis
    return out


def schema_tokens(schema: dict[str, Any]) -> int:
    """A bound on the prompt tokens the schema sent as response_format adds (bytes bound
    tokens, as for messages)."""
    return len(json.dumps(schema, ensure_ascii=False).encode("utf-8", "replace")) + 64


def response_format(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """OpenAI's strict `json_schema` response format, named after the subtask."""
    return {"type": "json_schema", "json_schema": {
        "name": _SCHEMA_NAME.sub("_", name).strip("_")[:64] or "output",
        "schema": schema, "strict": True}}


def refuses_format(exc: Exception) -> bool:
    """A gateway that does not take `json_schema`: a 400 whose error names response_format."""
    if not isinstance(exc, GatewayRejected) or exc.status_code != 400 or not exc.attempts:
        return False
    return "response_format" in (exc.attempts[-1].error or "")


def with_schema(messages: Sequence[dict[str, Any]], schema: dict[str, Any]
                ) -> list[dict[str, Any]]:
    """The messages of a `json_object` call: the schema appended to the system message."""
    said = f"{SCHEMA_HEAD}\n{json.dumps(schema, ensure_ascii=False)}"
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0].get('content') or ''}\n\n{said}".lstrip()
    else:
        out.insert(0, {"role": "system", "content": said})
    return out


def repair_messages(messages: Sequence[dict[str, Any]], answer: str,
                    errors: Sequence[str]) -> list[dict[str, Any]]:
    """The one repair turn: the invalid answer replayed, then what is wrong with it."""
    told = "\n".join(f"- {e}" for e in errors[:ERRORS_SHOWN])
    return [*messages, {"role": "assistant", "content": answer},
            {"role": "user", "content": "That answer is not valid for the required JSON "
                                        f"Schema:\n{told}\nAnswer again with the corrected "
                                        "JSON only."}]


def validation_errors(schema: dict[str, Any], value: Any) -> list[str]:
    """What makes `value` invalid for `schema` (empty: valid), each with its location."""
    validator = _validator(_text_of(schema))
    try:
        found = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    except (Unresolvable, PatternRefused) as exc:
        # a '#...' reference to nothing, or a pattern refused since: no value can be valid
        return [f"the schema cannot be applied: {exc}"[:ERROR_CHARS]]
    except RecursionError:  # a value (or a recursive schema) deeper than Python's stack
        return ["the answer is nested too deeply to validate"]
    return [f"{'/'.join(str(p) for p in e.path) or '(root)'}: {e.message}"[:ERROR_CHARS]
            for e in found[:ERRORS_SHOWN]]


_NOTHING = object()


def _whole(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # an answer nested past the parser's depth too
        return _NOTHING


def extract(text: str) -> Any:
    """The one JSON value of the answer's code fences, else the one JSON object or array in
    its prose; `_NOTHING` when there is none or more than one."""
    fenced = [v for m in _FENCE.finditer(text) if (v := _whole(m.group(1).strip()))
              is not _NOTHING]
    if fenced:
        return fenced[0] if len(fenced) == 1 else _NOTHING
    decoder, found, pos, tries = json.JSONDecoder(), [], 0, 0
    while tries < _PROSE_STARTS:
        starts = [i for i in (text.find("{", pos), text.find("[", pos)) if i >= 0]
        if not starts:
            break
        start = min(starts)
        try:
            value, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            tries += 1
            pos = start + 1
            continue
        found.append(value)
        pos = end
    return found[0] if len(found) == 1 else _NOTHING


@dataclass(frozen=True, slots=True)
class Judged:
    """An answer read against the schema: the value taken (`how` whole | extracted), or
    None with the errors to repair it by."""

    value: Any
    how: str | None
    errors: list[str]


def judge(schema: dict[str, Any], text: str) -> Judged:
    """Parse and validate the answer; failing that, the one JSON value inside it."""
    value = _whole(text.strip())
    if value is not _NOTHING:
        errors = validation_errors(schema, value)
        if not errors:
            return Judged(value, "whole", [])
    else:
        errors = ["the answer is not JSON"]
    inside = extract(text)
    if inside is not _NOTHING and not validation_errors(schema, inside):
        return Judged(inside, "extracted", [])
    return Judged(None, None, errors)


def json_text(value: Any) -> str:
    """The JSON text dependents and the synthesizer receive."""
    return json.dumps(value, ensure_ascii=False)


