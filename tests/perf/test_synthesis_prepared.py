"""The synthesizer's call is prepared on the workers' answers: its first attempt's row is
queued before the last worker's result and commits with it, so the call goes out one commit
sooner. It is still sent only once every result is durable, and only as built on what was
stored: a result the database refuses afterwards cancels the prepared attempt (never sent,
costing nothing) and the call is made anew; a swarm that stops instead cancels it too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import pytest

from app.db import changes
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent, by_name, capped, daily_cap, ledger, record_batches

pytestmark = pytest.mark.latency_devices

@pytest.fixture(params=["uncapped", "capped"])
async def h(request: pytest.FixtureRequest, database_url: str, tmp_path: Path
            ) -> AsyncIterator[Harness]:
    harness, close = await start_harness(
        make_settings(database_url, **daily_cap(request.param, tmp_path)))
    yield harness
    await close()


def refuse_result_of(name: str, h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database refuses any write holding `name`'s success (as it would text it cannot
    store): the group commit retries per write and rejects that one alone."""
    writer = h.app.state.engine.writer
    apply = writer._apply

    async def refusing(writes: list[changes.SwarmWrite]) -> set[str]:
        if any(s["name_"] == name and s["status"] == "succeeded"
               for w in writes for s in w.subtasks):
            raise ValueError(f"refused: {name}'s result")
        result: set[str] = await apply(writes)
        return result

    monkeypatch.setattr(writer, "_apply", refusing)


def synth_rows(rows: list[changes.SwarmWrite]) -> list[str]:
    return [r["outcome"] for w in rows for r in w.ledger if r["subtask_name"] == "@synthesizer"]


async def test_the_synthesizers_attempt_commits_with_the_last_result(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = record_batches(h, monkeypatch)
    body = {"task": "t", "agents": [agent("a"), agent("b"), agent("c", "[[sim latency_ms=300]]")]}
    data = await h.run(body)
    assert data["status"] == "succeeded", data["error"]
    mine = [[w for w in batch if w.swarm_id == data["id"]] for batch in batches]

    def results(writes: list[changes.SwarmWrite]) -> set[str]:
        return {s["name_"] for w in writes for s in w.subtasks
                if s["status"] == "succeeded" and s["name_"] != "@synthesizer"}

    ahead = [i for i, writes in enumerate(mine) if "in_flight" in synth_rows(writes)]
    assert len(ahead) == 1, [synth_rows(w) for w in mine]
    last = max(i for i, writes in enumerate(mine) if "c" in results(writes))
    if capped(h):
        # the tenant's daily cap is asked first: written ahead while the results commit
        assert ahead[0] >= last
    else:  # the slow worker's result and the synthesizer's row ahead: one commit
        assert ahead[0] == last, (ahead, last)
    # and the call was sent after it: once, the row it wrote ahead settled
    rows = [r for r in await ledger(h, data["id"]) if r.subtask_name == "@synthesizer"]
    assert [(r.attempt, r.outcome) for r in rows] == [(1, "ok")]
    assert by_name(data)["@synthesizer"]["attempts"] == 1


async def test_a_result_refused_after_the_synthesizer_was_prepared_cancels_that_attempt(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last worker's result is refused by the database: the synthesizer was prepared
    with it. That worker fails alone (within the tolerance); the prepared attempt is
    cancelled, never sent, and the synthesizer is called on what is stored, under a key of
    its own."""
    refuse_result_of("late", h, monkeypatch)
    body = {"task": "t", "agents": [agent("a"), agent("late", "[[sim latency_ms=300]]")],
            "limits": {"failure_tolerance": 0.5}}
    data = await h.run(body)
    assert data["status"] == "succeeded", data["error"]
    subs = by_name(data)
    assert subs["late"]["status"] == "failed"
    assert subs["late"]["error"]["code"] == "output_unstorable"
    synth = subs["@synthesizer"]
    assert synth["status"] == "succeeded" and synth["attempts"] == 1

    rows = await ledger(h, data["id"])
    mine = [(r.idempotency_key.rsplit(":", 1)[1], r.attempt, r.outcome, r.cost_usd)
            for r in rows if r.subtask_name == "@synthesizer"]
    assert mine[0] == ("1", 1, "cancelled", Decimal(0)), mine
    assert [(k, a, o) for k, a, o, _ in mine[1:]] == [("2", 1, "ok")], mine
    assert not [r for r in rows if r.outcome == "in_flight"]
    assert Decimal(data["usage"]["cost_usd"]) == sum((r.cost_usd for r in rows), Decimal(0))
    assert data["usage"]["gateway_calls"] == len([r for r in rows if r.outcome != "cancelled"])


async def test_a_swarm_that_stops_cancels_the_prepared_attempt(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last worker fails past the tolerance: the synthesizer, prepared on the answers,
    is never called, and its row ahead is settled `cancelled` before the swarm's end."""
    batches = record_batches(h, monkeypatch)
    refuse_result_of("late", h, monkeypatch)
    body = {"task": "t", "agents": [agent("a"), agent("late", "[[sim latency_ms=300]]")],
            "limits": {"failure_tolerance": 0}}
    data = await h.run(body)
    assert data["status"] == "failed"
    assert data["error"]["code"] == "failure_tolerance_exceeded", data["error"]
    rows = [r for r in await ledger(h, data["id"]) if r.subtask_name == "@synthesizer"]
    cancelled = [(1, "cancelled", Decimal(0))]
    # with a daily cap to ask first, the stop may come before its row is written at all
    allowed = [cancelled, []] if capped(h) else [cancelled]
    assert [(r.attempt, r.outcome, r.cost_usd) for r in rows] in allowed
    assert by_name(data)["@synthesizer"]["status"] == "skipped"
    assert by_name(data)["@synthesizer"]["attempts"] == 0
    mine = [w for batch in batches for w in batch if w.swarm_id == data["id"]]
    assert mine[-1].swarm["status"] == "failed"  # the end is the swarm's last write
    assert not synth_rows(mine[-1:])
