"""Server-Sent Events (SPEC §3 events): a finished, a running and a failed swarm's streams and
Last-Event-ID's bounds in process; from an API replica that does not run the swarm, a
client that disconnects and resumes with Last-Event-ID, possibly on another replica, gets
every event exactly once and in order; keep-alive pings do not disturb a standard parser."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Harness
from tests.helpers import BODY, agent, error_of, read_events
from tests.procs import Db, cluster, owner_pid, post_swarm, wait_terminal

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(90)]
# SPEC §6's event names of a stored event (a delta is not stored)
EVENT_NAMES = {"swarm.status", "subtask.started", "subtask.succeeded", "subtask.failed",
               "subtask.skipped", "swarm.completed"}
PING_S = 3  # SWARM_SSE_PING_S for these processes (15 by default)


@dataclass
class Sse:
    id: str | None
    event: str
    data: str


@dataclass
class Stream:
    """What one connection received: events, comment lines (pings), and whether it ended."""

    events: list[Sse] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    ended: bool = False


async def parse(lines: AsyncIterator[str], out: Stream) -> AsyncIterator[Sse]:
    """The WHATWG event-stream parser: fields, comments (`:`), dispatch on a blank line."""
    data: list[str] = []
    event, last_id = "", None
    async for line in lines:
        if line == "":
            if data:
                yield Sse(last_id, event or "message", "\n".join(data))
            data, event = [], ""
            continue
        if line.startswith(":"):
            out.comments.append(line)
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id" and "\0" not in value:
            last_id = value


async def read(api: str, swarm_id: str, last_id: str | None, stop_after: int | None = None,
               until_comment: bool = False) -> Stream:
    """Read one connection; hang up after `stop_after` events (or after the first comment,
    with `until_comment`), as a client going away mid-stream."""
    out = Stream()
    headers = {"Last-Event-ID": last_id} if last_id is not None else {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=PING_S + 10)) as client, \
            client.stream("GET", f"{api}/swarms/{swarm_id}/events", headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for ev in parse(r.aiter_lines(), out):
            out.events.append(ev)
            if stop_after is not None and len(out.events) >= stop_after:
                return out
            if until_comment and out.comments:
                return out
        out.ended = True
    return out


def expected(swarm_id: str, rows: list[Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(str(r["seq"]), r["type"], {"seq": r["seq"], "swarm_id": swarm_id, **r["data"]})
            for r in rows]


def received(events: list[Sse]) -> list[tuple[str | None, str, dict[str, Any]]]:
    return [(e.id, e.event, json.loads(e.data)) for e in events]


async def test_resume_with_last_event_id_on_replicas_without_engine(db_url: str,
                                                                    tmp_path: Path) -> None:
    db = Db(db_url)
    step = "[[sim latency_ms=250]]"
    # `slow` keeps the stream open past one keep-alive interval
    body = {"task": "events", "max_tokens": 80,
            "agents": [agent("a", step), agent("b", step, depends_on=["a"]),
                       agent("c", step, depends_on=["b"]),
                       agent("slow", f"[[sim latency_ms={(PING_S + 3) * 1000}]]")]}
    async with cluster(db_url, tmp_path, SWARM_SSE_PING_S=str(PING_S)) as c:
        await c.simulator(latency_ms=20)
        api_1, api_2, worker = await asyncio.gather(c.api("api_1"), c.api("api_2"),
                                                    c.worker("worker"))
        swarm_id = (await post_swarm(api_1, body))["id"]

        # 1: a few events, then hang up
        first = await read(api_1, swarm_id, None, stop_after=3)
        assert not first.ended and len(first.events) == 3
        # 2: resume on the other replica; stay through a keep-alive ping, then hang up
        second = await read(api_2, swarm_id, first.events[-1].id, until_comment=True)
        assert second.comments and not second.ended, "no keep-alive ping"
        assert second.comments[0].startswith(": ping")
        # 3: resume again and read to the end (the stream closes after swarm.completed)
        last = (second.events or first.events)[-1].id
        third = await read(api_1, swarm_id, last)
        assert third.ended

        await wait_terminal(api_1, swarm_id)
        rows = await db.events(swarm_id)
        got = received(first.events + second.events + third.events)
        assert got == expected(swarm_id, rows)  # every event once, in order, as stored
        assert [int(i or 0) for i, _, _ in got] == list(range(1, len(rows) + 1))
        assert got[-1][1] == "swarm.completed"
        assert second.events, "the ping came while events were still to come"
        # served by replicas that do not run the swarm
        assert owner_pid(await db.lease_owner(swarm_id)) == worker.pid

        # after the end: resuming at the last id ends at once; from 0 replays everything
        tail = await read(api_2, swarm_id, str(len(rows)))
        assert tail.ended and tail.events == []
        replay = await read(api_2, swarm_id, "0")
        assert received(replay.events) == expected(swarm_id, rows)


# ---- events ------------------------------------------------------------------------------------


async def test_events_of_finished_swarm(api: Harness) -> None:
    data = await api.run(BODY)
    events = await read_events(api.client, data["id"])
    ids = [int(e["id"]) for e in events]
    assert ids == list(range(1, len(events) + 1))
    assert {e["event"] for e in events} <= EVENT_NAMES
    assert [e["event"] for e in events].count("swarm.completed") == 1
    assert events[-1]["event"] == "swarm.completed"
    assert events[-1]["data"]["status"] == "succeeded"
    for e in events:
        assert e["data"]["seq"] == int(e["id"]) and e["data"]["swarm_id"] == data["id"]
    started = [e["data"]["name"] for e in events if e["event"] == "subtask.started"]
    assert sorted(started) == sorted(s["name"] for s in data["subtasks"])

    resumed = await read_events(api.client, data["id"], {"Last-Event-ID": "3"})
    assert resumed == events[3:]
    assert await read_events(api.client, data["id"], {"Last-Event-ID": "0"}) == events
    # resuming at (or past) the last event ends at once instead of hanging
    for last in (str(len(events)), str(len(events) + 50)):
        assert await read_events(api.client, data["id"], {"Last-Event-ID": last}) == []


async def test_events_stream_a_running_swarm_to_its_end(api: Harness) -> None:
    body = {"task": "t", "agents": [{"name": "a", "system_prompt": "[[sim latency_ms=200]]"},
                                    {"name": "b", "depends_on": ["a"]}]}
    sid = (await api.post(body)).json()["id"]
    events = await read_events(api.client, sid)
    assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["event"] == "swarm.completed"
    names = [(e["event"], e["data"].get("name")) for e in events]
    assert names.index(("subtask.succeeded", "a")) < names.index(("subtask.started", "b"))


async def test_events_failed_swarm_reports_failure_and_completes(api: Harness) -> None:
    body = {"task": "t", "agents": [{"name": "bad", "system_prompt": "[[sim fail=400]]"},
                                    {"name": "next", "depends_on": ["bad"]}]}
    data = await api.run(body)
    assert data["status"] == "failed"
    events = await read_events(api.client, data["id"])
    kinds = [e["event"] for e in events]
    assert "subtask.failed" in kinds
    assert kinds[-1] == "swarm.completed" and events[-1]["data"]["status"] == "failed"


@pytest.mark.parametrize("last", ["abc", "1.5", "3x", "-1", "٣", "1_0",
                                  "2147483648", "99999999999999999999999"])
async def test_events_bad_last_event_id_is_400(api: Harness, last: str) -> None:
    """Event ids are integers in 0..2^31-1; anything else is refused before the stream opens
    (a number past the 32-bit column used to abort the stream mid-response)."""
    sid = (await api.run({"task": "t", "agents": [{"name": "a"}]}))["id"]
    r = await api.client.get(f"/swarms/{sid}/events",
                             headers={"Last-Event-ID": last.encode()})
    err = error_of(r, 400, "invalid_last_event_id")
    assert err["details"]["field"] == "Last-Event-ID"


async def test_events_last_event_id_at_the_bound_is_an_ended_stream(api: Harness) -> None:
    sid = (await api.run({"task": "t", "agents": [{"name": "a"}]}))["id"]
    r = await api.client.get(f"/swarms/{sid}/events", headers={"Last-Event-ID": "2147483647"})
    assert r.status_code == 200 and "event:" not in r.text
