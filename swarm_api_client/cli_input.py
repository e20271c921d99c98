"""What the CLI reads from a file or stdin: a request body, or a reviewer's plan (SPEC §14);
what it cannot read is `BadInput` (exit status 2, one line)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


class BadInput(Exception):
    """Bad usage or an unreadable input: the command's one line and exit status 2."""


def read_body(name: str, plan: bool = False) -> dict[str, Any]:
    """A JSON object from the file `name` (`-`: stdin); with `plan`, a plan to approve."""
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
    except OSError as exc:
        raise BadInput(f"cannot read {name}: {exc.strerror or exc}") from exc
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise BadInput(f"{'stdin' if name == '-' else name} is not valid JSON: {exc}") from exc
    if plan:  # a list of agents, or {"agents": [...], "limits"?} as a swarm's `plan` shows
        body = {"agents": body} if isinstance(body, list) else body
        if not isinstance(body, dict) or not isinstance(body.get("agents"), list):
            raise BadInput('the plan must be {"agents": [...]} or a JSON list of agents')
    if not isinstance(body, dict):
        raise BadInput("the request body must be a JSON object, e.g. {\"task\": \"...\"}")
    return body
