"""The simulator's tool-using answers (SPEC §9): deterministic tool calls, then a final text
that quotes every tool result. Pure functions, used by the answers (responses.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

QUOTE_MAX_CHARS = 2000  # per tool result quoted in the final answer


def tool_names(tools: Any) -> list[tuple[str, dict[str, Any]]]:
    """(function name, parameters schema) of each OpenAI tool definition; ValueError on junk."""
    if not isinstance(tools, list):
        raise ValueError("'tools' must be a list")
    out: list[tuple[str, dict[str, Any]]] = []
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError("each tool needs function.name")
        params = fn.get("parameters") if isinstance(fn, dict) else None
        out.append((name, params if isinstance(params, dict) else {}))
    return out


def turns_done(messages: list[Any]) -> int:
    """Assistant messages that asked for tools so far."""
    return sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))


def _value(schema: Any, base: str) -> Any:
    """A value valid for a (simple) JSON schema: its enum/default/example, else by type."""
    if not isinstance(schema, dict):
        return base
    for key in ("enum", "examples"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    if kind in ("integer", "number"):
        low = schema.get("minimum", 1)
        return int(low) if kind == "integer" else float(low)
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    if kind == "object":
        return {}
    return base


def arguments(params: dict[str, Any], base: str) -> dict[str, Any]:
    """Arguments for every required property (and string ones, which carry `base`)."""
    props = params.get("properties")
    required = params.get("required")
    if not isinstance(props, dict) or not isinstance(required, list):
        return {}
    return {name: _value(schema, base) for name, schema in props.items() if name in required}


def tool_calls(tools: list[tuple[str, dict[str, Any]]], topic: str, turn: int,
               extra: str | None) -> list[dict[str, Any]]:
    """One call of every offered tool (plus `extra`, a name nobody offered, on turn 1)."""
    base = topic if turn == 1 else f"{topic} #{turn}"
    names = [(n, p) for n, p in tools] + ([(extra, {})] if extra and turn == 1 else [])
    seed = hashlib.blake2b(f"{topic}|{turn}".encode(), digest_size=4).hexdigest()
    return [{"id": f"call_{seed}_{turn}_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments(params, base))}}
            for i, (name, params) in enumerate(names)]


# the planner prompt's line offering tools (app/engine/planner.py TOOLS_LINE)
PLANNER_TOOLS_LINE = "Tools you may give a subtask (its optional \"tools\" list): "


def offered_to_planner(texts: list[str]) -> list[str]:
    """The tools a planning prompt offers (the simulated plan gives them to every subtask)."""
    for text in texts:
        at = text.find(PLANNER_TOOLS_LINE)
        if at >= 0:
            line = text[at + len(PLANNER_TOOLS_LINE):].split(". ", 1)[0]
            return [t.strip() for t in line.split(",") if t.strip()]
    return []


def final_answer(messages: list[Any]) -> str:
    """Text quoting every tool result of the conversation, in order."""
    quotes = []
    for m in messages:
        if m.get("role") == "tool":
            text = m.get("content") if isinstance(m.get("content"), str) else ""
            quotes.append(f"- {m.get('tool_call_id')}: {text[:QUOTE_MAX_CHARS]}")
    return "Based on the tool results:\n" + "\n".join(quotes)
