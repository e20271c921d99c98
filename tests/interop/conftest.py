"""The interop suite: real software the project did not write (LiteLLM's proxy, the PyPI MCP
servers), each installed in a virtualenv of its own by `make interop` (never a dependency of
the service). Outside `make interop` (SWARM_INTEROP unset) these tests are skipped; inside it a
neighbour that is not installed fails the run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ON = os.environ.get("SWARM_INTEROP") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if ON:
        return
    skip = pytest.mark.skip(reason="interop suite: run `make interop`")
    for item in items:
        if "tests/interop/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


def neighbour(venv: str, command: str) -> str:
    """A neighbour's executable in its own virtualenv (`make interop` installs it)."""
    path = ROOT / venv / "bin" / command
    found = str(path) if path.exists() else shutil.which(command)
    if found is None:
        pytest.fail(f"{command} is not installed: `make interop` installs it in {venv}")
    return found
