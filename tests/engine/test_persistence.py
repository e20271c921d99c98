"""Restarting the service keeps every swarm, its subtasks, ledger and events."""

from __future__ import annotations

from tests.conftest import make_settings, start_harness


async def test_restart_keeps_swarms_and_subtasks(database_url: str) -> None:
    settings = make_settings(database_url)
    h, close = await start_harness(settings)
    body = {"task": "t", "agents": [{"name": "a"}, {"name": "b", "depends_on": ["a"]}]}
    before = await h.run(body)
    assert before["status"] == "succeeded"
    await close()

    h2, close2 = await start_harness(settings)
    try:
        after = (await h2.client.get(f"/swarms/{before['id']}")).json()
        events = await h2.client.get(f"/swarms/{before['id']}/events")
    finally:
        await close2()
    for key in ("status", "subtasks", "usage", "result", "progress", "created_at", "spec"):
        assert after[key] == before[key], key
    # started + succeeded per subtask, running + synthesizing statuses, completed
    assert events.text.count("event: ") == len(before["subtasks"]) * 2 + 3
