"""`queue_position` is set while a swarm is queued (SPEC §3) in lists as in a single read:
one count places a page's queued swarms; a filtered page counts each (both backends)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.conftest import Harness, make_settings, start_harness


@pytest.fixture
async def idle(database_url: str) -> AsyncIterator[Harness]:
    h, close = await start_harness(make_settings(database_url), run_engine=False)
    yield h  # no engine: every swarm stays queued
    await close()


async def test_a_list_says_each_queued_swarms_place(idle: Harness) -> None:
    h = idle
    ids = [(await h.post({"task": f"t{i}", "agents": [{"name": "a"}]})).json()["id"]
           for i in range(4)]
    cancelled = ids.pop(1)  # a cancelled swarm leaves the queue: those after it move up
    assert (await h.client.post(f"/swarms/{cancelled}/cancel")).status_code == 202
    single = {i: (await h.client.get(f"/swarms/{i}")).json()["queue_position"] for i in ids}
    assert list(single.values()) == [1, 2, 3]

    page = (await h.client.get("/swarms")).json()["items"]
    assert {s["id"]: s["queue_position"] for s in page} == {**single, cancelled: None}
    first = (await h.client.get("/swarms", params={"limit": 2})).json()
    rest = (await h.client.get("/swarms", params={"limit": 2,
                                                  "cursor": first["next_cursor"]})).json()
    paged = {s["id"]: s["queue_position"] for s in first["items"] + rest["items"]}
    assert paged == {**single, cancelled: None}
    queued = (await h.client.get("/swarms", params={"status": "queued"})).json()["items"]
    assert [s["queue_position"] for s in queued] == [3, 2, 1]

    retry = (await h.client.post(f"/swarms/{cancelled}/retry")).json()["id"]
    retries = (await h.client.get("/swarms", params={"retry_of": cancelled})).json()["items"]
    assert [(s["id"], s["queue_position"]) for s in retries] == [(retry, 4)]
