"""Scheduler behaviour of SPEC §4 through the API, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import func, select

from app.db.tables import GatewayCall
from tests.conftest import Harness
from tests.helpers import agent, by_name, ledger, until


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_fanout_of_100_never_exceeds_concurrency(harness: Harness) -> None:
    body = {"task": "t", "agents": [agent(f"a{i}", "[[sim latency_ms=20]]") for i in range(100)],
            "synthesis": {"strategy": "none"}, "limits": {"concurrency": 8}}
    data = await harness.run(body, timeout=60)
    assert data["status"] == "succeeded"
    assert data["progress"]["succeeded"] == 100
    seen = (await harness.stats())["max_in_flight_by_swarm"][data["id"]]
    assert seen == 8  # saturated, never above


async def test_dependents_start_after_dependencies_and_receive_outputs(harness: Harness) -> None:
    body = {"task": "t", "agents": [
        agent("a", "[[sim latency_ms=50]]"), agent("b", "[[sim latency_ms=30]]"),
        agent("c", depends_on=["a", "b"], prompt="combine")],
        "synthesis": {"strategy": "none"}}
    data = await harness.run(body)
    assert data["status"] == "succeeded"
    subs = by_name(data)
    assert ts(subs["c"]["started_at"]) >= ts(subs["a"]["finished_at"])
    assert ts(subs["c"]["started_at"]) >= ts(subs["b"]["finished_at"])
    sent = (await harness.stats())["by_key"][f"{data['id']}:c:1"]["last_messages"]
    user = sent[-1]["content"]
    assert user.startswith("combine")
    assert "### a\n" + subs["a"]["output"] in user
    assert "### b\n" + subs["b"]["output"] in user


async def test_chain_runs_beside_an_independent_agent(harness: Harness) -> None:
    body = {"task": "t", "agents": [
        agent("a", "[[sim latency_ms=400]]"), agent("b", "[[sim latency_ms=400]]",
                                                     depends_on=["a"]),
        agent("c", "[[sim latency_ms=400]]", depends_on=["b"]),
        # d outlasts the chain's first two links by far, so scheduling delays on a loaded
        # machine cannot blur "b starts while d still runs" (a wave scheduler would start b
        # after d); the chain itself is long enough (1.2 s) that wall < serial leaves a loaded
        # machine over a second of overhead (CI once read 1.852 < 1.836 with a 0.3 s chain)
        agent("d", "[[sim latency_ms=1500]]")], "synthesis": {"strategy": "none"}}
    data = await harness.run(body)
    subs = by_name(data)
    assert ts(subs["d"]["started_at"]) < ts(subs["a"]["finished_at"])
    # not in waves: b starts when a finishes, while d (slower) is still running
    assert ts(subs["b"]["started_at"]) < ts(subs["d"]["finished_at"])
    assert data["timing"]["critical_path_s"] >= 1.5  # d alone
    assert data["timing"]["wall_s"] < data["timing"]["serial_s"]


@pytest.mark.parametrize("fault", ["429", "500", "502", "503", "504", "529", "408", "409",
                                   "html502", "truncated", "timeout"])
async def test_each_retryable_fault_is_retried_and_recovers(harness: Harness, fault: str) -> None:
    directive = f"[[sim fail={fault} times=1 retry_after=0 hang_s=5]]"
    body = {"task": "t", "agents": [agent("a", directive)], "synthesis": {"strategy": "none"},
            "limits": {"subtask_timeout_s": 0.5, "max_attempts": 3}}
    data = await harness.run(body)
    assert data["status"] == "succeeded", data["error"]
    assert by_name(data)["a"]["attempts"] == 2
    assert data["usage"]["gateway_calls"] == 2
    rows = await ledger(harness, data["id"])
    assert [r.attempt for r in rows] == [1, 2]
    assert rows[1].outcome == "ok" and rows[0].outcome != "ok"
    assert rows[0].idempotency_key == rows[1].idempotency_key == f"{data['id']}:a:1"


async def test_retry_after_is_waited_for(harness: Harness) -> None:
    body = {"task": "t", "agents": [agent("a", "[[sim fail=429 times=1 retry_after=0.6]]")],
            "synthesis": {"strategy": "none"}}
    data = await harness.run(body)
    assert data["status"] == "succeeded"
    assert by_name(data)["a"]["latency_ms"] >= 600


async def test_exhausted_retries_fail_the_subtask_as_gateway_unavailable(harness: Harness) -> None:
    body = {"task": "t", "agents": [agent("a", "[[sim fail=503 retry_after=0]]")],
            "synthesis": {"strategy": "none"}, "limits": {"max_attempts": 2}}
    data = await harness.run(body)
    assert data["status"] == "failed"
    assert data["error"]["code"] == "failure_tolerance_exceeded"
    a = by_name(data)["a"]
    assert a["status"] == "failed" and a["attempts"] == 2
    assert a["error"]["code"] == "gateway_unavailable"


async def test_401_is_not_retried_and_fails_the_swarm_gateway_rejected(harness: Harness) -> None:
    body = {"task": "t", "agents": [agent("a", "[[sim fail=401]]"),
                                    agent("b", "[[sim latency_ms=2000]]")],
            "limits": {"failure_tolerance": 1.0}}
    data = await harness.run(body)
    assert data["timing"]["wall_s"] < 1.5  # b's in-flight call was cancelled
    assert data["status"] == "failed"
    assert data["error"]["code"] == "gateway_rejected"
    subs = by_name(data)
    assert subs["a"]["attempts"] == 1 and subs["a"]["status"] == "failed"
    assert subs["b"]["status"] == "cancelled"
    assert subs["@synthesizer"]["status"] == "skipped"


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_client_errors_are_not_retried(harness: Harness, status: int) -> None:
    body = {"task": "t", "agents": [agent("a", f"[[sim fail={status}]]"), agent("b")],
            "synthesis": {"strategy": "none"}, "limits": {"failure_tolerance": 0.5}}
    data = await harness.run(body)
    assert data["status"] == "succeeded"
    a = by_name(data)["a"]
    assert a["status"] == "failed" and a["attempts"] == 1
    assert a["error"]["code"] == "gateway_rejected"


async def test_failure_beyond_tolerance_fails_and_keeps_finished_outputs(harness: Harness) -> None:
    body = {"task": "t", "agents": [
        agent("ok1"), agent("ok2"),
        agent("bad", "[[sim fail=500 latency_ms=100 retry_after=0]]"),
        agent("slow", "[[sim latency_ms=3000]]")],
        "limits": {"failure_tolerance": 0.0, "max_attempts": 1}}
    data = await harness.run(body)
    assert data["status"] == "failed"
    assert data["error"]["code"] == "failure_tolerance_exceeded"
    subs = by_name(data)
    assert subs["ok1"]["status"] == "succeeded" and subs["ok1"]["output"]
    assert subs["ok2"]["status"] == "succeeded" and subs["ok2"]["output"]
    assert subs["bad"]["status"] == "failed"
    assert subs["slow"]["status"] == "cancelled"
    assert subs["@synthesizer"]["status"] == "skipped"


async def test_failure_within_tolerance_skips_dependents_and_succeeds(harness: Harness) -> None:
    body = {"task": "t", "agents": [
        agent("a", "[[sim fail=500 retry_after=0]]"), agent("b", depends_on=["a"]),
        agent("c", depends_on=["b"]), agent("d"), agent("e")],
        "limits": {"failure_tolerance": 0.25, "max_attempts": 1}}
    data = await harness.run(body)
    assert data["status"] == "succeeded", data["error"]
    subs = by_name(data)
    assert subs["a"]["status"] == "failed"
    assert subs["b"]["status"] == "skipped" and subs["c"]["status"] == "skipped"
    assert subs["d"]["status"] == "succeeded" and subs["e"]["status"] == "succeeded"
    assert subs["@synthesizer"]["status"] == "succeeded"
    synth_prompt = (await harness.stats())["by_key"][f"{data['id']}:@synthesizer:1"][
        "last_messages"][-1]["content"]
    assert "### d" in synth_prompt and "### e" in synth_prompt and "### a" not in synth_prompt
    assert "No result from: a, b, c" in synth_prompt
    assert data["progress"]["skipped"] == 2 and data["progress"]["failed"] == 1


async def test_cancel_stops_in_flight_calls_within_a_second(harness: Harness) -> None:
    body = {"task": "t", "agents": [agent("fast"), agent("s1", "[[sim latency_ms=20000]]"),
                                    agent("s2", "[[sim latency_ms=20000]]"),
                                    agent("later", depends_on=["s1"])]}
    r = await harness.post(body)
    swarm_id = r.json()["id"]

    async def fast_done_slow_on_the_wire() -> bool:
        fast = by_name((await harness.client.get(f"/swarms/{swarm_id}")).json())["fast"]
        return fast["status"] == "succeeded" and (await harness.stats())["in_flight"] == 2

    await until(fast_done_slow_on_the_wire, 4, "fast done, s1 and s2 on the wire", every=0.02)
    t0 = time.monotonic()
    assert (await harness.client.post(f"/swarms/{swarm_id}/cancel")).status_code == 202
    data = await harness.wait(swarm_id, timeout=5)
    assert time.monotonic() - t0 < 1.0
    assert data["status"] == "cancelled"
    subs = by_name(data)
    assert subs["fast"]["status"] == "succeeded" and subs["fast"]["output"]
    assert subs["s1"]["status"] == subs["s2"]["status"] == "cancelled"
    assert subs["later"]["status"] == "cancelled"
    assert (await harness.stats())["in_flight"] == 0


async def test_deadline_stops_in_flight_calls(harness: Harness) -> None:
    body = {"task": "t", "agents": [agent("fast"), agent("slow", "[[sim latency_ms=20000]]")],
            "limits": {"deadline_s": 0.8}}
    data = await harness.run(body)
    # SPEC §4: in-flight calls are cancelled within a second of the deadline, on the swarm's own
    # clock (the client's wait adds its polling and creation on a loaded machine)
    assert data["timing"]["wall_s"] < 0.8 + 1.0
    assert data["status"] == "failed"
    assert data["error"]["code"] == "deadline_exceeded"
    subs = by_name(data)
    assert subs["fast"]["status"] == "succeeded"
    assert subs["slow"]["status"] == "cancelled"
    assert (await harness.stats())["in_flight"] == 0


async def test_concatenate_puts_results_in_topological_order(harness: Harness) -> None:
    body = {"task": "t", "agents": [agent("z", depends_on=["y"]), agent("y"),
                                    agent("x")],
            "synthesis": {"strategy": "concatenate"}}
    data = await harness.run(body)
    subs = by_name(data)
    assert data["result"] == "\n\n".join(
        f"## {n}\n\n{subs[n]['output']}" for n in ("y", "x", "z"))
    assert data["usage"]["gateway_calls"] == 3  # no LLM for the fan-in


async def test_vote_picks_the_heaviest_normalised_answer(harness: Harness) -> None:
    body = {"task": "t", "agents": [
        agent("a", '[[sim answer="No"]]', weight=2.5),
        agent("b", '[[sim answer="yes"]]'), agent("c", '[[sim answer="Yes."]]'),
        agent("d", '[[sim answer=" YES "]]')],
        "synthesis": {"strategy": "vote"}}
    data = await harness.run(body)
    assert data["result"] == "yes"  # 3 votes beat a weight of 2.5; the earliest wording wins


    assert data["vote"] == {"outcome": "majority", "winner": "b",
                            "weights": {"a": 2.5, "b": 3.0}}
    assert [s["name"] for s in data["subtasks"]] == ["a", "b", "c", "d"]  # no synthesizer


async def test_vote_tie_goes_to_the_earliest_agent(harness: Harness) -> None:
    body = {"task": "t", "agents": [agent("a", '[[sim answer="blue"]]'),
                                    agent("b", '[[sim answer="red"]]'),
                                    agent("c", '[[sim answer="red"]]'),
                                    agent("d", '[[sim answer="Blue"]]')],
            "synthesis": {"strategy": "vote"}}
    data = await harness.run(body)
    assert data["result"] == "blue"
    assert data["vote"] == {"outcome": "plurality", "winner": "a",
                            "weights": {"a": 2.0, "b": 2.0}}


async def test_a_vote_of_answers_that_all_differ_is_synthesized(harness: Harness) -> None:
    """SPEC §3: when no two answers agree the result is synthesized instead, and the swarm's
    vote says no_majority (five different file reviews have no winner)."""
    body = {"task": "t", "agents": [agent(f"r{i}", f"review file {i}") for i in range(5)],
            "synthesis": {"strategy": "vote"}}
    data = await harness.run(body)
    assert data["status"] == "succeeded"
    assert data["vote"] == {"outcome": "no_majority", "winner": None,
                            "weights": {f"r{i}": 1.0 for i in range(5)}}
    synth = data["subtasks"][-1]
    assert (synth["name"], synth["kind"], synth["status"]) == (
        "@synthesizer", "synthesizer", "succeeded")
    assert data["result"] == synth["output"]
    assert synth["depends_on"] == [f"r{i}" for i in range(5)]
    assert data["usage"]["gateway_calls"] == 6  # the five answers and the synthesis
    outputs = {s["output"] for s in data["subtasks"][:5]}
    assert data["result"] not in outputs


async def test_strategy_none_has_no_result(harness: Harness) -> None:
    data = await harness.run({"task": "t", "agents": [agent("a")],
                              "synthesis": {"strategy": "none"}})
    assert data["status"] == "succeeded" and data["result"] is None


async def test_budget_is_a_hard_cap(harness: Harness) -> None:
    # each call reserves (prompt bytes + max_tokens) at kimi prices, ~0.0025 USD, and really
    # uses all 1000 output tokens: two fit in 0.006, the third can never fit
    body = {"task": "t", "agents": [agent(f"a{i}", "[[sim latency_ms=30 completion_tokens=1000]]")
                                    for i in range(6)],
            "max_tokens": 1000, "synthesis": {"strategy": "none"},
            "limits": {"budget_usd": "0.006", "concurrency": 6}}
    data = await harness.run(body)
    assert data["status"] == "failed"
    assert data["error"]["code"] == "budget_exceeded"
    spent = Decimal(data["usage"]["cost_usd"])
    assert Decimal("0.005") < spent <= Decimal("0.006")
    assert data["progress"]["succeeded"] == 2
    assert data["progress"]["skipped"] + data["progress"]["cancelled"] == 4


async def test_ledger_reconciles_with_swarm_usage(harness: Harness) -> None:
    body = {"task": "t", "agents": [agent("a", "[[sim fail=500 times=1 retry_after=0]]"),
                                    agent("b", "[[sim fail=429 times=2 retry_after=0]]"),
                                    agent("c", depends_on=["a"])]}
    data = await harness.run(body)
    rows = await ledger(harness, data["id"])
    assert len(rows) == data["usage"]["gateway_calls"] == 2 + 3 + 1 + 1
    total = sum((r.cost_usd for r in rows), Decimal(0))
    assert total == Decimal(data["usage"]["cost_usd"])
    assert sum(Decimal(s["usage"]["cost_usd"]) for s in data["subtasks"]) == total
    assert sum(r.prompt_tokens for r in rows) == data["usage"]["prompt_tokens"]
    async with harness.app.state.sessions() as s:
        n = (await s.execute(select(func.count()).select_from(GatewayCall))).scalar_one()
    assert n == len(rows)


async def test_events_are_consecutive_and_end_with_completed(harness: Harness) -> None:
    data = await harness.run({"task": "t", "agents": [agent("a"), agent("b", depends_on=["a"])]})
    async with harness.client.stream("GET", f"/swarms/{data['id']}/events") as r:
        text = "".join([chunk async for chunk in r.aiter_text()])
    ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    names = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
    assert ids == list(range(1, len(ids) + 1))
    assert names[0] == "swarm.status" and names[-1] == "swarm.completed"
    assert names.count("subtask.started") == 3 and names.count("subtask.succeeded") == 3


@pytest.mark.parametrize("limit", ["process", "swarm"])
async def test_a_slot_is_free_while_the_previous_result_commits(
        database_url: str, monkeypatch: pytest.MonkeyPatch, limit: str) -> None:
    """SWARM_MAX_INFLIGHT and limits.concurrency count gateway calls in flight: with one slot,
    the next call goes out while the previous subtask's result is still being committed (held
    up here for 2 s)."""
    from app.engine.writer import StateWriter
    from tests.conftest import make_settings, start_harness

    real = StateWriter._apply
    held = 0

    async def slow_success(self: StateWriter, batch: Any) -> set[str]:
        nonlocal held
        if any(row.get("name_") == "a" and row.get("status") == "succeeded"
               for w in batch for row in w.subtasks) and not held:
            held += 1
            await asyncio.sleep(2)
        return await real(self, batch)

    monkeypatch.setattr(StateWriter, "_apply", slow_success)
    one = {"max_inflight": 1} if limit == "process" else {}
    h, close = await start_harness(make_settings(database_url, **one))
    try:
        # a's call outlasts b's write-ahead, which is then not in the commit held up
        data = await h.run({"task": "t", "agents": [agent("a", "[[sim latency_ms=300]]"),
                                                     agent("b")],
                            "synthesis": {"strategy": "none"},
                            "limits": {"concurrency": 1 if limit == "swarm" else 8}}, timeout=30)
    finally:
        await close()
    assert data["status"] == "succeeded" and held == 1
    subs = by_name(data)
    # b's call started (and ended) inside a's 2 s commit, not after it
    assert ts(subs["b"]["started_at"]) < ts(subs["a"]["finished_at"]) + timedelta(seconds=1.5)
    assert data["usage"]["gateway_calls"] == 2
