"""A wave's starts are one write (`SwarmJournal.started`): the subtasks a swarm launches in one
turn of the loop each number their `subtask.started` event as they start, and their rows and
events are written together after their calls went out, not a write each before them. With
the latency devices off (SWARM_LATENCY_DEVICES), each start is a write of its own."""

from __future__ import annotations

import pytest

from tests.conftest import make_settings, start_harness
from tests.helpers import agent, record_batches


@pytest.mark.parametrize("devices", [True, False])
async def test_the_starts_of_a_wave_are_one_write(database_url: str, devices: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    h, close = await start_harness(make_settings(database_url, latency_devices=devices))
    batches = record_batches(h, monkeypatch)
    try:
        names = [f"w{i}" for i in range(6)]
        data = await h.run({"task": "t", "agents": [agent(n, "[[sim latency_ms=200]]")
                                                    for n in names],
                            "synthesis": {"strategy": "none"}})
    finally:
        await close()
    assert data["status"] == "succeeded", data["error"]
    mine = [w for batch in batches for w in batch if w.swarm_id == data["id"]]
    starts = [w for w in mine if any(e["type"] == "subtask.started" for e in w.events)]
    assert len(starts) == (1 if devices else len(names)), [[e["type"] for e in w.events]
                                                             for w in mine]
    if not devices:
        return
    (wave,) = starts
    began = [e for e in wave.events if e["type"] == "subtask.started"]
    assert sorted(e["data"]["name"] for e in began) == names
    assert sorted(r["name_"] for r in wave.subtasks if r["status"] == "running") == names
    seqs = [e["seq"] for e in wave.events]
    assert seqs == sorted(seqs) and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
