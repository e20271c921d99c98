"""A tool turn's end (its `subtask.turn` event) is queued as the turn's last result is in and
the next turn's attempt is written ahead at once: without a daily cap to ask first, both go in
one group commit (one commit between an agent's tool results and its next gateway call, not
two); with one, the end commits while the cap reservation is made. Either way the end is
durable before that call is sent (no later commit than its write-ahead). The first turn's
attempt is written with the swarm's creation where the first wave's is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.db import changes
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import capped, daily_cap, record_batches
from tests.mcp_servers import stdio_server, write_config


@pytest.fixture(params=["uncapped", "capped"])
async def h(request: pytest.FixtureRequest, database_url: str, tmp_path: Path
            ) -> AsyncIterator[Harness]:
    config = write_config(tmp_path / "mcp.json", {"docs": stdio_server(tmp_path / "docs.log")})
    harness, close = await start_harness(make_settings(
        database_url, mcp_config=config, **daily_cap(request.param, tmp_path)))
    yield harness
    await close()


def _turn_ends(w: changes.SwarmWrite) -> list[int]:
    return [e["data"]["turn"] for e in w.events if e["type"] == "subtask.turn"]


def _ahead(w: changes.SwarmWrite) -> list[str]:
    return [r["idempotency_key"] for r in w.ledger if r["outcome"] == "in_flight"]


async def test_the_turn_end_commits_with_the_next_turns_write_ahead(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = record_batches(h, monkeypatch)
    body = {"task": "t", "synthesis": {"strategy": "none"}, "agents": [
        {"name": "a", "tools": ["docs.lookup"], "max_turns": 3,
         "prompt": "look [[sim turns=2]]"}]}
    data = await h.run(body)
    assert data["status"] == "succeeded", data["error"]
    assert data["subtasks"][0]["turns"] == 3
    key = f"{data['id']}:a"
    mine = [[w for w in batch if w.swarm_id == data["id"]] for batch in batches]
    for turn in (1, 2):
        [end] = [i for i, batch in enumerate(mine) for w in batch if turn in _turn_ends(w)]
        [ahead] = [i for i, batch in enumerate(mine) for w in batch
                   if f"{key}:{turn + 1}" in _ahead(w)]
        assert end <= ahead if capped(h) else end == ahead, (turn, end, ahead)
    # the first turn's attempt has no turn before it: written with the creation (the first
    # wave, tests/perf/test_first_wave.py), else ahead on its own
    firsts = [i for i, batch in enumerate(mine) for w in batch if f"{key}:1" in _ahead(w)]
    if capped(h) or not h.app.state.settings.latency_devices:
        [first] = firsts
        assert not any(_turn_ends(w) for w in mine[first])
    else:
        assert firsts == []
