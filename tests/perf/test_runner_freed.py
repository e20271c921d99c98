"""A finished swarm's state is freed when its runner ends, by reference counting alone: a
reference cycle through the runner kept a whole swarm (its rows, outputs, events) until one of
the collector's rare full passes — a 1,000-agent swarm's ~2 MB, for up to ~20 swarms — and the
lease heartbeat's loop held the last runner it looked at while the process was idle."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from app.engine.runner import SwarmRunner
from app.engine.scheduler import Scheduler
from app.simulator import SimulatorConfig
from tests.conftest import make_settings, start_harness


async def test_a_finished_swarm_is_freed_without_the_collector(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[weakref.ref[SwarmRunner]] = []
    drive = Scheduler._drive

    def recording(self: Scheduler, runner: SwarmRunner) -> None:
        made.append(weakref.ref(runner))
        drive(self, runner)

    monkeypatch.setattr(Scheduler, "_drive", recording)
    # a heartbeat every 0.1 s, and calls of 0.3 s: the heartbeat sees the runner while it runs
    h, close = await start_harness(make_settings(database_url, lease_seconds=0.3),
                                   SimulatorConfig(latency_ms=300))
    body = {"task": "t", "synthesis": {"strategy": "synthesize"},
            "agents": [{"name": "a"}, {"name": "b", "depends_on": ["a"]}, {"name": "c"}]}
    gc.collect()
    gc.disable()  # only reference counting frees anything from here
    try:
        data = await h.run(body)
        assert data["status"] == "succeeded"
        await asyncio.sleep(0.35)  # the scheduler lets go in its task's done-callback
        assert made, "no runner was driven"
        assert all(r() is None for r in made), "a finished runner is still alive"
    finally:
        gc.enable()
        await close()
