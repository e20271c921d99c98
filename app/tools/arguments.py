"""A model's tool-call arguments made safe for a server that other swarms share (SPEC §9).

The arguments are the model's text: bounded (SWARM_TOOL_ARGS_MAX_BYTES), parsed, cleaned like
any text from outside (NUL and lone surrogates, which a JSON escape `\\ud800` yields, replaced),
nested no deeper than a server can be sent, and serialised here once as the transport will
serialise them. A stdio transport serialises in the one task that writes to the server: a value
it cannot encode there ends the session of every call in flight, so what fails here is this
call's error alone.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from app.text import storable

if TYPE_CHECKING:
    import mcp_types as types

MAX_DEPTH = 64  # nesting of objects and arrays (the SDK's serialiser stops at a few hundred)


class ArgumentsRefused(ValueError):
    """The arguments cannot be sent; the message says why (the model reads it)."""


def parse_arguments(text: str, max_bytes: int) -> dict[str, Any]:
    """The model's arguments text as a cleaned JSON object, or ArgumentsRefused."""
    size = len(text.encode(errors="surrogatepass"))
    if size > max_bytes:
        raise ArgumentsRefused(f"the arguments are {size} bytes; at most {max_bytes} are sent")
    try:
        value = json.loads(text or "{}")
    except (ValueError, RecursionError):
        raise ArgumentsRefused("the arguments are not a JSON object") from None
    if not isinstance(value, dict):
        raise ArgumentsRefused("the arguments are not a JSON object")
    return cleaned_arguments(value)


def cleaned_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` with every string (keys too) storable; ArgumentsRefused past MAX_DEPTH."""
    out = _cleaned(arguments, 1)
    assert isinstance(out, dict)
    return out


def _cleaned(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return storable(value)[0]
    if isinstance(value, dict | list):
        if depth > MAX_DEPTH:
            raise ArgumentsRefused(f"the arguments nest deeper than {MAX_DEPTH} levels")
        if isinstance(value, list):
            return [_cleaned(v, depth + 1) for v in value]
        return {storable(str(k))[0]: _cleaned(v, depth + 1) for k, v in value.items()}
    return value


def check_sendable(tool: str, arguments: dict[str, Any]) -> types.CallToolRequest:
    """The call's request, serialised once as the transports do (the request is what is sent:
    it is built once); ArgumentsRefused when it fails."""
    import mcp_types as types  # the SDK loads only in a process with tool servers

    try:
        request = types.CallToolRequest(params=types.CallToolRequestParams(
            name=tool, arguments=arguments))
        request.model_dump_json(by_alias=True, exclude_unset=True)
        return request
    except Exception as exc:  # any failure to encode is this call's, never the session's
        raise ArgumentsRefused(
            f"the arguments cannot be sent: {type(exc).__name__}: {str(exc)[:200]}") from None
