"""The PyPI MCP servers `mcp-server-time` and `mcp-server-git` as a swarm's tools (SPEC §9):
every tool listed with its schema, real results in the transcript, each call in the tool
ledger."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.db import queries
from tests.conftest import Harness, make_settings, start_harness
from tests.interop.conftest import neighbour
from tests.mcp_servers import write_config

COMMIT = "interop: the first commit"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    (path / "README").write_text("hello\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", COMMIT], check=True)
    return path


@pytest.fixture
async def tooled(database_url: str, tmp_path: Path, repo: Path) -> AsyncIterator[Harness]:
    config = write_config(tmp_path / "mcp.json", {
        "time": {"command": neighbour(".venv-mcp", "mcp-server-time"),
                 "args": ["--local-timezone", "UTC"], "max_concurrency": 4},
        "git": {"command": neighbour(".venv-mcp", "mcp-server-git"),
                "args": ["--repository", str(repo)], "max_concurrency": 2},
    })
    h, close = await start_harness(make_settings(database_url, mcp_config=config))
    yield h
    await close()


async def test_every_tool_is_listed_with_its_schema(tooled: Harness) -> None:
    r = await tooled.client.get("/tools")
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    names = {(i["server"], i["name"]) for i in items}
    assert {("time", "get_current_time"), ("time", "convert_time"), ("git", "git_log"),
            ("git", "git_status"), ("git", "git_show")} <= names, names
    for item in items:
        schema = item["input_schema"]
        assert schema.get("type") == "object" and isinstance(schema.get("properties"), dict), item


async def test_agents_get_real_results_from_both_servers(tooled: Harness, repo: Path) -> None:
    body = {"task": "what time is it, and what changed", "synthesis": {"strategy": "none"},
            "agents": [{"name": f"clock{i}", "prompt": "UTC",
                        "tools": ["time.get_current_time"]} for i in range(4)]
            + [{"name": "history", "prompt": str(repo), "tools": ["git.git_log"]},
               {"name": "state", "prompt": str(repo), "tools": ["git.git_status"]}]}
    done = await tooled.run(body, timeout=90)
    assert done["status"] == "succeeded", done["error"]
    results: dict[str, str] = {}
    for name in ("clock0", "history", "state"):
        r = await tooled.client.get(f"/swarms/{done['id']}/subtasks/{name}")
        tool_messages = [m["content"] for m in r.json()["transcript"] if m["role"] == "tool"]
        assert len(tool_messages) == 1, tool_messages
        results[name] = tool_messages[0]
    assert '"timezone": "UTC"' in results["clock0"] or "UTC" in results["clock0"], results
    assert not results["clock0"].startswith("error"), results
    assert COMMIT in results["history"], results
    assert "working tree clean" in results["state"] or "branch" in results["state"], results
    async with tooled.app.state.sessions() as s, s.begin():
        ledger = await queries.get_tool_calls(s, done["id"])
    assert sorted({(c.server, c.tool, c.status) for c in ledger}) == [
        ("git", "git_log", "ok"), ("git", "git_status", "ok"), ("time", "get_current_time", "ok")]
    assert len(ledger) == 6
