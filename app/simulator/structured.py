"""The simulator's structured answers: a minimal JSON value valid for the schema a call asks
for (`response_format` json_schema, or json_object with the schema in the system message),
and the `output=` directive's faults — a code fence, prose until a repair turn, always invalid."""

from __future__ import annotations

import json
from typing import Any

OUTPUT_KINDS = frozenset({"fence", "prose", "invalid"})
_MARKER = "JSON Schema"  # a json_object call's system message names the schema, then gives it
_PROSE = "I looked into it carefully and the answer is positive, with a few open questions."


def asked_schema(fmt: Any, messages: list[Any]) -> dict[str, Any] | None:
    """The schema of a call: its json_schema response format's, or the one a json_object
    call's system message carries after the words "JSON Schema"."""
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        return schema if isinstance(schema, dict) else {}
    if fmt.get("type") != "json_object":
        return None
    for m in messages:
        text = m.get("content") if m.get("role") == "system" else None
        if not isinstance(text, str) or _MARKER not in text:
            continue
        start = text.find("{", text.index(_MARKER))
        try:
            found, _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return None


def answer(schema: dict[str, Any], kind: str | None, messages: list[Any]) -> str:
    """The content for a call asking `schema`; `kind` is the `output=` directive."""
    text = json.dumps(instance(schema, schema))
    repaired = any(isinstance(m, dict) and m.get("role") == "assistant"
                   and not m.get("tool_calls") for m in messages)
    if kind == "fence":
        return f"Here is the result you asked for:\n```json\n{text}\n```\nAnything else?"
    if kind == "prose" and not repaired:
        return _PROSE
    if kind == "invalid":
        # a value of another type than the schema's, else prose: never valid
        if schema.get("type") == "object":
            return json.dumps(["not", "an", "object"])
        return json.dumps({"not": "valid"}) if "type" in schema else _PROSE
    return text


def instance(schema: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """A minimal value valid for `schema` (the keywords a structured-output schema uses)."""
    if not isinstance(schema, dict) or depth > 32:
        return None if schema is not True else {}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        return instance(_resolve(root, ref), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return instance(schema[key][0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        required = schema.get("required") or list(props)
        return {name: instance(props.get(name, {}), root, depth + 1) for name in required}
    if kind == "array":
        items = schema.get("items", {})
        return [instance(items, root, depth + 1) for _ in range(int(schema.get("minItems", 0)))]
    return _scalar(schema, kind)


def _resolve(root: dict[str, Any], ref: str) -> Any:
    target: Any = root
    for part in filter(None, ref[1:].split("/")):
        key = part.replace("~1", "/").replace("~0", "~")
        target = target.get(key, {}) if isinstance(target, dict) else {}
    return target


def _scalar(schema: dict[str, Any], kind: Any) -> Any:
    if kind == "string":
        return "x" * int(schema.get("minLength", min(2, schema.get("maxLength", 2))))
    if kind in ("integer", "number"):
        if "minimum" in schema:
            value = schema["minimum"]
        elif "exclusiveMinimum" in schema:
            value = schema["exclusiveMinimum"] + 1
        else:
            value = min(0, schema.get("maximum", 0))
        return int(value) if kind == "integer" else value
    if kind == "boolean":
        return True
    return None
