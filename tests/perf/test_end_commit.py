"""The swarm's last result (its synthesizer's, or without one its last worker's) is written
with the swarm's end: one commit where there were two. What is stored is what the two commits
stored — in the sequence of events too — and a result the database refuses fails its subtask,
and the swarm as that failure did alone; a shutdown that drains the swarm right after its
synthesizer answered writes that result alone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from app.db import changes, queries
from app.gateway import attempts as gateway_attempts
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent, by_name, record_batches, until


# a worker whose answer carries a directive for the synthesizer, which reads it
def handing_on(name: str, directive: str) -> dict[str, Any]:
    quoted = directive.replace('"', '\\"')
    return agent(name, f'[[sim answer="{quoted}"]]')


@pytest.fixture
async def h(database_url: str) -> AsyncIterator[Harness]:
    harness, close = await start_harness(make_settings(database_url))
    yield harness
    await close()


async def stored_events(h: Harness, swarm_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    async with h.app.state.sessions() as s, s.begin():
        return [(e.seq, e.type, e.data) for e in await queries.events_after(s, swarm_id, 0)]


async def test_the_synthesizers_result_commits_with_the_end(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = record_batches(h, monkeypatch)
    body = {"task": "t", "agents": [agent("a"), agent("b")]}
    data = await h.run(body)
    assert data["status"] == "succeeded", data["error"]
    synth = by_name(data)["@synthesizer"]
    assert synth["status"] == "succeeded" and synth["output"] == data["result"] != ""

    def synth_state(w: changes.SwarmWrite) -> list[str]:
        return [s["status"] for s in w.subtasks if s["name_"] == "@synthesizer"]

    mine = [w for batch in batches for w in batch if w.swarm_id == data["id"]]
    done = [w for w in mine if "succeeded" in synth_state(w)]
    assert len(done) == 1, [synth_state(w) for w in mine]
    assert done[0] is mine[-1]  # the end's write: the swarm's last
    assert [e["type"] for e in done[0].events] == [
        "subtask.succeeded", "swarm.completed"]
    assert done[0].swarm["status"] == "succeeded" and done[0].swarm["result"] == data["result"]
    assert done[0].ledger and all(r["outcome"] == "ok" for r in done[0].ledger)

    events = await stored_events(h, data["id"])
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    assert [(t, d.get("name")) for _, t, d in events[-2:]] == [
        ("subtask.succeeded", "@synthesizer"), ("swarm.completed", None)]


async def test_a_refused_result_fails_the_synthesizer_and_the_swarm_keeping_its_spend(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cleaning is off and the synthesizer's answer is poisoned: no database stores it.
    The end's commit is refused; the synthesizer fails (`output_unstorable`) and the swarm
    with it, as when its result was committed alone, its spend recorded."""
    monkeypatch.setattr(gateway_attempts, "storable", lambda text: (text, False))
    body = {"task": "t", "agents": [handing_on("a", "[[sim poison=1]]"), agent("b")]}
    data = await h.run(body)
    subs = by_name(data)
    assert subs["a"]["status"] == subs["b"]["status"] == "succeeded"
    synth = subs["@synthesizer"]
    assert synth["status"] == "failed" and synth["output"] is None
    assert synth["error"]["code"] == "output_unstorable", synth["error"]
    assert Decimal(synth["usage"]["cost_usd"]) > 0  # billed, though its result is lost
    assert data["status"] == "failed" and data["result"] is None
    assert data["error"]["code"] == "output_unstorable"
    total = sum(Decimal(s["usage"]["cost_usd"]) for s in data["subtasks"])
    assert Decimal(data["usage"]["cost_usd"]) == total > 0

    events = await stored_events(h, data["id"])
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    (_, failed, detail), (_, last, end) = events[-2:]
    assert (failed, detail["name"], detail["error"]["code"]) == (
        "subtask.failed", "@synthesizer", "output_unstorable")
    assert (last, end["status"], end["error"]["code"]) == (
        "swarm.completed", "failed", "output_unstorable")


async def test_a_drain_writes_the_synthesizers_result_alone(h: Harness) -> None:
    """A shutdown while the synthesizer is in flight: its answer arrives within the grace,
    the runner drains instead of ending the swarm, and the result is committed all the same
    (the next owner does not call it again)."""
    body = {"task": "t", "agents": [handing_on("a", "[[sim latency_ms=1500]]")]}
    r = await h.post(body)
    assert r.status_code == 202, r.text
    swarm_id = r.json()["id"]

    async def synthesizing() -> bool:
        got = (await h.client.get(f"/swarms/{swarm_id}")).json()
        return bool(by_name(got)["@synthesizer"]["status"] == "running")

    await until(synthesizing, 10, "the synthesizer's call")
    await h.app.state.engine.stop(grace_s=10)
    data = (await h.client.get(f"/swarms/{swarm_id}")).json()
    assert data["status"] == "synthesizing"  # unfinished: released for the next owner
    synth = by_name(data)["@synthesizer"]
    assert synth["status"] == "succeeded" and synth["output"], synth
    events = await stored_events(h, swarm_id)
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    assert (events[-1][1], events[-1][2]["name"]) == ("subtask.succeeded", "@synthesizer")


async def test_without_a_synthesizer_the_last_workers_result_commits_with_the_end(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """No synthesizer follows: the last worker's result rides with the swarm's end, the
    others commit as they answer (a dependent starts only on a durable result)."""
    batches = record_batches(h, monkeypatch)
    body = {"task": "t", "agents": [agent("a"), agent("b", depends_on=["a"])],
            "synthesis": {"strategy": "concatenate"}}
    data = await h.run(body)
    assert data["status"] == "succeeded", data["error"]
    subs = by_name(data)
    assert subs["a"]["output"] in data["result"] and subs["b"]["output"] in data["result"]

    def done(w: changes.SwarmWrite) -> list[str]:
        return [s["name_"] for s in w.subtasks if s["status"] == "succeeded"]

    mine = [w for batch in batches for w in batch if w.swarm_id == data["id"]]
    assert [done(w) for w in mine if done(w)] == [["a"], ["b"]]
    assert done(mine[-1]) == ["b"]  # the end's write
    assert [e["type"] for e in mine[-1].events] == ["subtask.succeeded", "swarm.completed"]
    assert mine[-1].swarm["result"] == data["result"]
    assert mine[-1].ledger and all(r["outcome"] == "ok" for r in mine[-1].ledger)
    events = await stored_events(h, data["id"])
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))


@pytest.mark.parametrize("tolerance", [0.5, 0.0])
async def test_a_refused_last_worker_fails_alone_as_it_did_before_the_end(
        h: Harness, monkeypatch: pytest.MonkeyPatch, tolerance: float) -> None:
    """The cleaning is off and the last worker's answer is poisoned: the end's commit is
    refused. That worker fails (`output_unstorable`, billed) and the swarm ends as that
    failure alone would have ended it: within the tolerance it succeeds, its result
    combined without the lost answer; past it, it fails `failure_tolerance_exceeded`."""
    monkeypatch.setattr(gateway_attempts, "storable", lambda text: (text, False))
    body = {"task": "t", "synthesis": {"strategy": "concatenate"},
            "limits": {"failure_tolerance": tolerance},
            "agents": [agent("a"), agent("b", "[[sim poison=1]]", depends_on=["a"])]}
    data = await h.run(body)
    subs = by_name(data)
    assert subs["a"]["status"] == "succeeded"
    assert subs["b"]["status"] == "failed" and subs["b"]["output"] is None
    assert subs["b"]["error"]["code"] == "output_unstorable", subs["b"]["error"]
    assert Decimal(subs["b"]["usage"]["cost_usd"]) > 0
    total = sum(Decimal(s["usage"]["cost_usd"]) for s in data["subtasks"])
    assert Decimal(data["usage"]["cost_usd"]) == total > 0
    if tolerance:
        assert data["status"] == "succeeded" and data["error"] is None
        assert subs["a"]["output"] in data["result"]
    else:
        assert data["status"] == "failed" and data["result"] is None
        assert data["error"]["code"] == "failure_tolerance_exceeded", data["error"]
    events = await stored_events(h, data["id"])
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    (_, failed, detail), (_, last, end) = events[-2:]
    assert (failed, detail["name"], detail["error"]["code"]) == (
        "subtask.failed", "b", "output_unstorable")
    assert (last, end["status"]) == ("swarm.completed", data["status"])
    assert end["error"] == data["error"]
