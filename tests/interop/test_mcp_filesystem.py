"""The npm MCP server `@modelcontextprotocol/server-filesystem` (installed by `make interop`
with the machine's npm) as a swarm's tools: its tools listed with their schemas, real
directory listings and file contents in the transcripts, each call ok in the tool ledger.
Skipped, with the reason, only where npm could not install it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.db import queries
from tests.conftest import Harness, make_settings, start_harness
from tests.interop.conftest import ROOT
from tests.mcp_servers import write_config

SERVER = ROOT / ".interop-npm" / "node_modules" / ".bin" / "mcp-server-filesystem"
NOTE = "interop: a note the filesystem server reads"


@pytest.fixture
async def files(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[Harness, Path]]:
    if not SERVER.exists():
        pytest.skip(f"{SERVER.name} is not installed (npm missing or offline: "
                    "`make interop` installs it with npm)")
    root = tmp_path / "shared"
    root.mkdir()
    (root / "notes.txt").write_text(NOTE + "\n")
    (root / "plan.md").write_text("# plan\n")
    config = write_config(tmp_path / "mcp.json", {
        "fs": {"command": str(SERVER), "args": [str(root)], "max_concurrency": 2}})
    h, close = await start_harness(make_settings(database_url, mcp_config=config))
    yield h, root
    await close()


async def test_the_filesystem_servers_tools_serve_real_files(
        files: tuple[Harness, Path]) -> None:
    h, root = files
    r = await h.client.get("/tools")
    assert r.status_code == 200, r.text
    names = {i["name"] for i in r.json()["items"] if i["server"] == "fs"}
    assert {"list_directory", "read_text_file"} <= names, names
    body = {"task": "what is in the shared folder", "synthesis": {"strategy": "none"},
            "agents": [{"name": "ls", "prompt": str(root), "tools": ["fs.list_directory"]},
                       {"name": "read", "prompt": str(root / "notes.txt"),
                        "tools": ["fs.read_text_file"]}]}
    done = await h.run(body, timeout=90)
    assert done["status"] == "succeeded", done["error"]
    seen = {}
    for name in ("ls", "read"):
        r = await h.client.get(f"/swarms/{done['id']}/subtasks/{name}")
        (seen[name],) = [m["content"] for m in r.json()["transcript"] if m["role"] == "tool"]
    assert "notes.txt" in seen["ls"] and "plan.md" in seen["ls"], seen
    assert NOTE in seen["read"], seen
    async with h.app.state.sessions() as s, s.begin():
        ledger = await queries.get_tool_calls(s, done["id"])
    assert sorted((c.tool, c.status) for c in ledger) == [
        ("list_directory", "ok"), ("read_text_file", "ok")]
