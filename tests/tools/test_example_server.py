"""The example MCP server (examples/mcp/server.py) reads its folder once but answers from what
is on disk: a file edited, added or removed between calls shows in the next `lookup`; its call
log gets one line per call start and end. Over stdio, its streams are pipes (the fast path) and
`read_file`, `fail` and the log behave as documented."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.tools.config import ServerConfig
from app.tools.registry import ToolRegistry
from tests.mcp_servers import calls, stdio_server


@pytest.fixture
async def docs(tmp_path: Path) -> AsyncIterator[tuple[ToolRegistry, Path]]:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("alpha line\nBeta Line\n")
    config = stdio_server(tmp_path / "calls.log")
    config["env"]["EXAMPLE_MCP_ROOT"] = str(root)
    registry = ToolRegistry({"docs": ServerConfig.model_validate(config)}, start_wait_s=120)
    await registry.start()
    yield registry, root
    await registry.stop()


async def test_lookup_follows_the_folder(docs: tuple[ToolRegistry, Path]) -> None:
    registry, root = docs
    first = await registry.call("docs", "lookup", {"query": "LINE"})
    assert first.text == "lookup 'LINE': a.txt: alpha line; a.txt: Beta Line"
    (root / "a.txt").write_text("alpha line\ngamma line\n")  # edited
    (root / "b.txt").write_text("b line\n")  # added
    (root / "skipped.md").write_text("a line elsewhere\n")  # not a .txt
    edited = await registry.call("docs", "lookup", {"query": "line"})
    assert edited.text == "lookup 'line': a.txt: alpha line; a.txt: gamma line; b.txt: b line"
    (root / "b.txt").unlink()  # removed
    removed = await registry.call("docs", "lookup", {"query": "line"})
    assert removed.text == "lookup 'line': a.txt: alpha line; a.txt: gamma line"
    nothing = await registry.call("docs", "lookup", {"query": "zzz"})
    assert nothing.text == "lookup 'zzz': no match"


async def test_a_file_read_long_ago_is_read_again_when_its_mtime_moves(
        docs: tuple[ToolRegistry, Path]) -> None:
    registry, root = docs
    old = time.time_ns() - 60 * 10**9  # past the window where every call reads again
    os.utime(root / "a.txt", ns=(old, old))
    os.utime(root, ns=(old, old))
    first = await registry.call("docs", "lookup", {"query": "alpha"})
    assert first.text == "lookup 'alpha': a.txt: alpha line"
    (root / "a.txt").write_text("alpha LINE\nBeta Line\n")  # the same size
    os.utime(root / "a.txt", ns=(old + 10**9, old + 10**9))
    again = await registry.call("docs", "lookup", {"query": "alpha"})
    assert again.text == "lookup 'alpha': a.txt: alpha LINE"
    (root / "c.txt").write_text("alpha too\n")
    os.utime(root / "c.txt", ns=(old, old))
    os.utime(root, ns=(old + 10**9, old + 10**9))
    added = await registry.call("docs", "lookup", {"query": "alpha"})
    assert added.text == "lookup 'alpha': a.txt: alpha LINE; c.txt: alpha too"


async def test_the_other_tools_and_the_call_log(docs: tuple[ToolRegistry, Path],
                                                tmp_path: Path) -> None:
    registry, _ = docs
    read = await registry.call("docs", "read_file", {"path": "a.txt"})
    assert (read.status, read.text) == ("ok", "alpha line\nBeta Line\n")
    outside = await registry.call("docs", "read_file", {"path": "../calls.log"})
    assert outside.status == "error" and "no file" in outside.text
    failed = await registry.call("docs", "fail", {"reason": "asked"})
    assert failed.status == "error" and "fail was asked to fail: asked" in failed.text
    started = calls(tmp_path / "calls.log")
    ended = calls(tmp_path / "calls.log", "end")
    assert [c["tool"] for c in started] == ["read_file", "read_file", "fail"]
    assert [c["tool"] for c in ended] == ["read_file", "read_file", "fail"]
    assert all(c["session"] is None and c["in_flight"] == 1 for c in started)
