"""`GET /swarms/{id}?wait=` of a swarm that ends in this process answers from its runner's rows
(no read back), built while its end commits, and that answer is the swarm as stored: the same
as a plain GET afterwards — also when the end's commit is refused and the swarm ends
otherwise."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.api import swarms
from app.db.changes import SwarmWrite
from app.db.tables import Swarm
from tests.conftest import Harness
from tests.helpers import agent

SLOW = "[[sim latency_ms=250]]"  # the swarm is still running when the reader starts waiting
POISON = "[[sim poison=1]]"  # answers with a NUL and a lone surrogate: stored sanitized

SHAPES: dict[str, dict[str, Any]] = {
    "synthesized": {"task": "t", "agents": [
        {"name": "a", "prompt": f"alpha {SLOW}"}, {"name": "b", "prompt": f"beta {SLOW}"},
        {"name": "c", "prompt": f"gamma {SLOW}", "depends_on": ["a", "b"]}]},
    "partly failed": {"task": "t", "limits": {"failure_tolerance": 0.5}, "agents": [
        {"name": "ok", "prompt": f"fine {SLOW}"},
        {"name": "bad", "prompt": f"[[sim fail=400]] {SLOW}"},
        {"name": "after", "prompt": f"x {SLOW}", "depends_on": ["bad"]}],
        "synthesis": {"strategy": "concatenate"}},
    "failed": {"task": "t", "agents": [{"name": "bad", "prompt": f"[[sim fail=400]] {SLOW}"}]},
    "sanitized": {"task": "t", "agents": [{"name": "p", "prompt": f"{POISON} {SLOW}"}],
                  "synthesis": {"strategy": "vote"}},
}


@pytest.mark.parametrize("shape", SHAPES)
async def test_the_waited_answer_is_the_stored_swarm_without_a_read(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    reads: list[str] = []
    read = swarms._read

    async def counted(session: Any, swarm_id: str, tenant: str) -> bytes:
        reads.append(swarm_id)
        return await read(session, swarm_id, tenant)

    monkeypatch.setattr(swarms, "_read", counted)
    rendered = count_renders(harness, monkeypatch)
    created = (await harness.post(SHAPES[shape])).json()
    r = await harness.client.get(f"/swarms/{created['id']}", params={"wait": 20})
    assert r.status_code == 200
    waited = r.json()
    assert waited["status"] in ("succeeded", "failed")
    assert reads == []  # answered from the runner's rows
    assert rendered == [created["id"]]  # by the runner, while its end committed
    await asyncio.sleep(0.05)
    stored = (await harness.client.get(f"/swarms/{created['id']}")).json()
    assert reads == [created["id"]]
    assert waited == stored


def count_renders(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The swarms whose answer their runner built (`SwarmNotifier.render`); the handler's own
    rendering of a runner's rows fails the test."""
    notifier = harness.app.state.notifier
    render, rendered = notifier.renderer, []

    def counted(swarm: Swarm, subtasks: Any) -> bytes:
        rendered.append(swarm.id)
        return render(swarm, subtasks)

    def not_here(*_: Any) -> bytes:
        raise AssertionError("the reader rendered the rows itself")

    monkeypatch.setattr(notifier, "renderer", counted)
    monkeypatch.setattr(swarms, "ended_answer", not_here)
    return rendered


async def test_a_refused_end_is_answered_as_it_was_stored_not_as_it_was_built(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer built while the end committed showed the swarm succeeded; the database
    refused that commit (here: every write holding the synthesizer's success), so the
    synthesizer failed `output_unstorable` and the swarm with it: the waiting reader gets
    that failure, as stored, from the answer built for the commit that stored it."""
    writer = harness.app.state.engine.writer
    apply = writer._apply

    async def refusing(writes: list[SwarmWrite]) -> set[str]:
        if any(s["name_"] == "@synthesizer" and s["status"] == "succeeded"
               for w in writes for s in w.subtasks):
            raise ValueError("refused")  # as the database refuses a row
        result: set[str] = await apply(writes)
        return result

    monkeypatch.setattr(writer, "_apply", refusing)
    rendered = count_renders(harness, monkeypatch)
    body = {"task": "t", "agents": [agent("a", SLOW), agent("b", SLOW)]}
    created = (await harness.post(body)).json()
    r = await harness.client.get(f"/swarms/{created['id']}", params={"wait": 20})
    waited = r.json()
    # built for the end it tried, dropped with that refused commit, built for the one stored
    assert rendered == [created["id"]] * 2
    assert waited["status"] == "failed", waited["status"]
    assert waited["error"]["code"] == "output_unstorable"
    stored = (await harness.client.get(f"/swarms/{created['id']}")).json()
    assert waited == stored
