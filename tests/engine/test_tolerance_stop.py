"""A failure that passes the failure tolerance stops launching at once (SPEC §4): the
subtask waiting for the failed call's slot is not sent — it was, then cancelled and billed
at its worst case — and what is recorded is only what was sent (both backends)."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import select

from app.db.tables import GatewayCall
from tests.conftest import Harness
from tests.helpers import by_name


async def test_the_slot_a_failure_frees_goes_to_no_one_once_the_swarm_stops(
        harness: Harness) -> None:
    body = {"task": "t", "synthesis": {"strategy": "none"},
            "limits": {"concurrency": 2, "failure_tolerance": 0},
            "agents": [{"name": "x", "prompt": "[[sim fail=400 latency_ms=100]]"},
                       {"name": "y", "prompt": "[[sim latency_ms=2000]]"},
                       {"name": "z"}, {"name": "w", "depends_on": ["z"]}]}
    done = await harness.run(body)
    assert (done["status"], done["error"]["code"]) == ("failed", "failure_tolerance_exceeded")
    subs = by_name(done)
    assert subs["z"]["status"] == "skipped" and subs["z"]["started_at"] is None, subs["z"]
    assert Decimal(subs["z"]["usage"]["cost_usd"]) == 0
    stream = (await harness.client.get(f"/swarms/{done['id']}/events")).text
    started = [block for block in stream.replace("\r\n", "\n").split("\n\n")
               if "event: subtask.started" in block and '"name": "z"' in block]
    assert started == [], started  # never begun: nothing sent for it


async def test_a_subtask_written_ahead_and_never_sent_counts_no_attempt(
        harness: Harness) -> None:
    """`b`'s first attempt is written ahead while `a` holds the one slot; `a`'s failure stops
    the swarm before `b` is sent: its row is `cancelled`, and `attempts` (the view's, read
    back after the end as well) counts what was sent — none."""
    body = {"task": "t", "synthesis": {"strategy": "none"},
            "limits": {"concurrency": 1, "failure_tolerance": 0},
            "agents": [{"name": "a", "prompt": "[[sim fail=400 latency_ms=300]]"},
                       {"name": "b"}, {"name": "c"}]}
    done = await harness.run(body)
    again = (await harness.client.get(f"/swarms/{done['id']}")).json()
    for view in (done, again):
        assert {n: (s["status"], s["attempts"]) for n, s in by_name(view).items()} == {
            "a": ("failed", 1), "b": ("skipped", 0), "c": ("skipped", 0)}
    async with harness.app.state.sessions() as s:
        rows = (await s.execute(select(GatewayCall.subtask_name, GatewayCall.outcome)
                                .where(GatewayCall.swarm_id == done["id"]))).all()
    assert sorted(rows) == [("a", "client_error"), ("b", "cancelled")]  # b was written ahead


async def test_a_swarm_its_subtasks_failed_names_their_causes(harness: Harness) -> None:
    """SPEC §3: the swarm's error counts its failed subtasks' codes and names one, so the cause
    (a model the gateway refuses, an outage) is read on the swarm, not only on each subtask."""
    body = {"task": "t", "synthesis": {"strategy": "none"},
            "limits": {"failure_tolerance": 0.5, "max_attempts": 1},
            "agents": [{"name": "a", "prompt": "[[sim fail=400]]"},
                       {"name": "b", "prompt": "[[sim fail=400 latency_ms=100]]"},
                       {"name": "c", "prompt": "[[sim fail=503 retry_after=0 latency_ms=200]]"},
                       {"name": "d", "prompt": "[[sim latency_ms=300]]"}]}
    done = await harness.run(body)
    err = done["error"]
    assert (done["status"], err["code"]) == ("failed", "failure_tolerance_exceeded")
    details = err["details"]
    failed = sorted(details["failed"])
    assert failed == ["a", "b", "c"], details
    assert details["causes"] == {"gateway_rejected": 2, "gateway_unavailable": 1}, details
    cause = details["cause"]
    assert cause["subtask"] in failed and cause["code"] == by_name(done)[cause["subtask"]][
        "error"]["code"], details
