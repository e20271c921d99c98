"""The budget property (tests/engine/test_budget_property.py) with tool-using agents: every
turn is a gateway call reserving on the grown conversation, and spend still never exceeds the
budget."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import PROPERTY, check_budget, swarms
from tests.mcp_servers import HttpServer, write_config

MODELS = ("deepseek-v3.2", "kimi-k2.5", "deepseek-v3.2", "gemini-2.5-flash", "gpt-4.1")


@pytest.fixture(scope="module")
def http_mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path_factory.mktemp("mcp") / "http.log")
    yield server
    server.close()


@pytest.fixture
async def tooled(sqlite_url: str, tmp_path: Path, http_mcp: HttpServer
                 ) -> AsyncIterator[Harness]:
    config = write_config(tmp_path / "mcp.json", {"web": {"url": http_mcp.url}})
    h, close = await start_harness(make_settings(sqlite_url, mcp_config=config))
    yield h
    await close()


@settings(PROPERTY, max_examples=12)
@given(body=swarms(MODELS, False), turns=st.lists(st.integers(0, 3), min_size=12, max_size=12))
async def test_turns_never_overspend(tooled: Harness, body: dict[str, Any],
                                     turns: list[int]) -> None:
    for agent, n in zip(body["agents"], turns, strict=False):
        if n:  # n tool turns, then the answer: n + 1 reservations, each on a longer prompt
            agent.update(tools=["web.lookup", "web.read_file"], max_turns=n + 1)
            agent["system_prompt"] += f" [[sim turns={n}]]"
    await check_budget(tooled, body)
