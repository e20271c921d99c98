"""SPEC §11 `POST /swarms/{id}/retry`: only what did not succeed is called again, on SQLite and
on PostgreSQL; the old swarm never changes; errors, Idempotency-Key, lineage and events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from app.db.columns import SUBTASK_DEFINITION as DEFINITION
from app.db.retry_copy import copy_columns
from app.db.tables import Subtask
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import agent, by_name, error_of, ledger, read_events

FLAKY_400 = "[[sim when=flaky fail=400]]"  # a non-retryable 400 while the flag is set
TERMINAL = ("succeeded", "failed", "cancelled")


def reused_count(kind: str) -> float:
    return REGISTRY.get_sample_value("swarm_subtasks_reused_total", {"kind": kind}) or 0.0


async def sim_calls(h: Harness, swarm_id: str) -> dict[str, int]:
    """{subtask name: calls} the simulator saw for this swarm."""
    by_key = (await h.stats())["by_key"]
    return {k.split(":")[1]: v["calls"] for k, v in by_key.items()
            if k.startswith(f"{swarm_id}:")}


async def definitions(h: Harness, swarm_id: str) -> list[tuple[Any, ...]]:
    """What each subtask of a swarm is (every column a retry copies), in order."""
    t = Subtask.__table__
    async with h.app.state.sessions() as s:
        rows = await s.execute(select(*(t.c[c] for c in DEFINITION))
                               .where(t.c.swarm_id == swarm_id).order_by(t.c.position))
        return [tuple(r) for r in rows]


async def retry(h: Harness, swarm_id: str, body: dict[str, Any] | None = None,
                **headers: str) -> dict[str, Any]:
    r = await h.client.post(f"/swarms/{swarm_id}/retry", json=body, headers=headers)
    assert r.status_code == 202, r.text
    data: dict[str, Any] = r.json()
    assert r.headers["location"] == f"/swarms/{data['id']}"
    assert data["id"] != swarm_id and data["retry_of"] == swarm_id
    return data


async def test_retry_calls_only_what_did_not_succeed(harness: Harness) -> None:
    flags = harness.simulator.state.config.flags
    flags.add("flaky")
    body = {"task": "t", "limits": {"failure_tolerance": 0.2}, "agents": [
        agent("a"), agent("b"), agent("c"),
        agent("x", FLAKY_400), agent("z", depends_on=["x"]),
        agent("y", FLAKY_400, depends_on=["a", "b", "c"]),
        agent("s", "[[sim when=flaky latency_ms=30000]]"),
        agent("p", depends_on=["a", "s"], prompt="use a and s")]}
    old = await harness.run(body)
    assert old["error"]["code"] == "failure_tolerance_exceeded"
    status = {n: s["status"] for n, s in by_name(old).items()}
    assert status == {"a": "succeeded", "b": "succeeded", "c": "succeeded", "x": "failed",
                      "y": "failed", "z": "skipped", "s": "cancelled", "p": "skipped",
                      "@synthesizer": "skipped"}
    assert by_name(old)["x"]["error"]["details"]["status"] == 400

    flags.discard("flaky")  # the fault is gone
    before = reused_count("worker")
    started = await retry(harness, old["id"])
    first = by_name(started)
    for n in ("a", "b", "c"):  # copied at once: succeeded, reused, same output, no cost
        assert first[n]["status"] == "succeeded" and first[n]["reused"] is True
        assert first[n]["output"] == by_name(old)[n]["output"]
        assert first[n]["attempts"] == 0 and Decimal(first[n]["usage"]["cost_usd"]) == 0
    assert all(not first[n]["reused"] and first[n]["status"] in ("pending", "running",
                                                                   "succeeded")
               for n in ("x", "y", "z", "s", "p", "@synthesizer"))
    assert reused_count("worker") == before + 3

    new = await harness.wait(started["id"])
    assert new["status"] == "succeeded", new["error"]
    assert new["result"] and all(s["status"] == "succeeded" for s in new["subtasks"])
    assert await definitions(harness, new["id"]) == await definitions(harness, old["id"])
    # the gateway saw only the failed, skipped, cancelled, never-started ones and the synthesis
    again = ["x", "y", "z", "s", "p", "@synthesizer"]
    assert await sim_calls(harness, new["id"]) == dict.fromkeys(again, 1)
    rows = await ledger(harness, new["id"])
    assert sorted(r.subtask_name for r in rows) == sorted(again)
    assert new["usage"]["gateway_calls"] == 6
    assert Decimal(new["usage"]["cost_usd"]) == sum(r.cost_usd for r in rows) > 0
    assert Decimal(new["usage"]["cost_usd"]) == sum(
        Decimal(s["usage"]["cost_usd"]) for s in new["subtasks"])
    # dependents of reused subtasks get their outputs; the synthesis merges reused ones too
    stats = (await harness.stats())["by_key"]
    a_out = by_name(old)["a"]["output"]
    assert f"### a\n{a_out}" in stats[f"{new['id']}:p:1"]["last_messages"][-1]["content"]
    assert f"### a\n{a_out}" in stats[f"{new['id']}:@synthesizer:1"]["last_messages"][-1][
        "content"]

    # the old swarm is unchanged but for its pointer to the retry
    now = (await harness.client.get(f"/swarms/{old['id']}")).json()
    assert now["retried_by"] == new["id"] and old["retried_by"] is None
    assert {**now, "retried_by": None} == old
    listed = (await harness.client.get("/swarms", params={"retry_of": old["id"]})).json()
    assert [s["id"] for s in listed["items"]] == [new["id"]]
    assert listed["items"][0]["retry_of"] == old["id"]

    events = await read_events(harness.client, new["id"])
    assert [(e["id"], e["event"], e["data"]["name"], e["data"]["reused"])
            for e in events[:3]] == [(str(i), "subtask.succeeded", n, True)
                                     for i, n in enumerate("abc", start=1)]
    assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
    assert not any(e["data"].get("reused") for e in events[3:])
    assert events[-1]["event"] == "swarm.completed"


async def test_retry_of_budget_exceeded_with_a_larger_budget_completes(harness: Harness) -> None:
    body = {"task": "t", "limits": {"budget_usd": "0.05", "concurrency": 3},
            "agents": [agent("a"), agent("b", max_tokens=50_000)],  # b's worst case: $0.125
            "synthesis": {"max_tokens": 100}}
    old = await harness.run(body)
    assert old["error"]["code"] == "budget_exceeded"
    assert by_name(old)["a"]["status"] == "succeeded"
    assert by_name(old)["b"]["status"] == "cancelled"

    started = await retry(harness, old["id"], {"limits": {"budget_usd": 1}})
    new = await harness.wait(started["id"])
    assert new["status"] == "succeeded", new["error"]
    assert Decimal(new["spec"]["limits"]["budget_usd"]) == 1
    assert new["spec"]["limits"]["concurrency"] == 3  # keys left out keep the old values
    assert by_name(new)["a"]["reused"] and not by_name(new)["b"]["reused"]
    assert await sim_calls(harness, new["id"]) == {"b": 1, "@synthesizer": 1}


async def test_retried_planned_swarm_keeps_its_plan(harness: Harness) -> None:
    body = {"task": "Compare three databases", "synthesis": {"max_tokens": 50_000},
            "limits": {"budget_usd": "0.05"}}  # the synthesis's worst case does not fit
    old = await harness.run(body)
    assert old["error"]["code"] == "budget_exceeded"
    planned = [s["name"] for s in old["subtasks"] if s["kind"] == "worker"]
    assert len(planned) == 4 and by_name(old)["@planner"]["status"] == "succeeded"

    started = await retry(harness, old["id"], {"limits": {"budget_usd": "1"}})
    new = await harness.wait(started["id"])
    assert new["status"] == "succeeded", new["error"]
    assert [s["name"] for s in new["subtasks"]] == [s["name"] for s in old["subtasks"]]
    assert all(by_name(new)[n]["reused"] for n in ["@planner", *planned])
    assert by_name(new)["@planner"]["output"] == by_name(old)["@planner"]["output"]
    assert await sim_calls(harness, new["id"]) == {"@synthesizer": 1}  # no planner call
    statuses = [e["data"]["status"] for e in await read_events(harness.client, new["id"])
                if e["event"] == "swarm.status"]
    assert "planning" not in statuses


@pytest.fixture
async def auth(sqlite_url: str) -> AsyncIterator[Harness]:
    h, close = await start_harness(make_settings(sqlite_url, api_keys="t1:k1,t2:k2"))
    yield h
    await close()


T1 = {"Authorization": "Bearer k1"}


async def failed_swarm(h: Harness) -> str:
    r = await h.client.post("/swarms", headers=T1, json={
        "task": "t", "agents": [agent("a", "[[sim fail=400]]")]})
    swarm_id: str = r.json()["id"]
    done = (await h.client.get(f"/swarms/{swarm_id}", params={"wait": 20}, headers=T1)).json()
    assert done["status"] == "failed"
    return swarm_id


async def test_only_failed_or_cancelled_swarms_of_the_caller_are_retried(auth: Harness) -> None:
    c = auth.client
    ok = (await c.post("/swarms", headers=T1, json={"task": "t", "agents": [agent("a")]})).json()
    assert (await c.get(f"/swarms/{ok['id']}", params={"wait": 20}, headers=T1)).json()[
        "status"] == "succeeded"
    err = error_of(await c.post(f"/swarms/{ok['id']}/retry", headers=T1), 409, "not_retryable")
    assert err["details"] == {"status": "succeeded"}
    auth.simulator.state.config.flags.add("slow")
    slow = (await c.post("/swarms", headers=T1, json={
        "task": "t", "agents": [agent("a", "[[sim when=slow latency_ms=3000]]")]})).json()
    error_of(await c.post(f"/swarms/{slow['id']}/retry", headers=T1), 409, "not_retryable")
    assert (await c.post(f"/swarms/{slow['id']}/cancel", headers=T1)).status_code == 202
    assert (await c.get(f"/swarms/{slow['id']}", params={"wait": 20}, headers=T1)).json()[
        "status"] == "cancelled"
    auth.simulator.state.config.flags.discard("slow")
    cancelled = await retry(auth, slow["id"], **T1)  # a cancelled swarm is retried

    failed = await failed_swarm(auth)
    for path in (f"/swarms/{failed}/retry", "/swarms/00000000-0000-0000-0000-000000000000/retry",
                 "/swarms/nope/retry"):  # another tenant's, unknown, malformed
        headers = {"Authorization": "Bearer k2"} if failed in path else T1
        error_of(await c.post(path, headers=headers), 404, "not_found")
    assert (await c.post(f"/swarms/{failed}/retry")).status_code == 401
    for bad in ({"limits": {"budget_usd": 0}}, {"limits": {"concurrency": 0}},
                {"limits": {"colour": 1}}, {"task": "other"}):
        error_of(await c.post(f"/swarms/{failed}/retry", json=bad, headers=T1), 422,
                 "validation_error")
    # nothing was created by the refusals: only the cancelled swarm has a retry
    for swarm_id, n in ((failed, 0), (slow["id"], 1), (ok["id"], 0)):
        listed = await c.get("/swarms", params={"retry_of": swarm_id}, headers=T1)
        assert len(listed.json()["items"]) == n
    assert (await c.get("/swarms", params={"retry_of": failed},
                        headers={"Authorization": "Bearer k2"})).json()["items"] == []
    error_of(await c.get("/swarms", params={"retry_of": "x"}, headers=T1), 422,
             "validation_error")
    done = await c.get(f"/swarms/{cancelled['id']}", params={"wait": 20}, headers=T1)
    assert done.json()["status"] == "succeeded"


async def test_idempotency_key_replays_the_same_retry(auth: Harness) -> None:
    c = auth.client
    failed = await failed_swarm(auth)
    key = {**T1, "Idempotency-Key": "retry-1"}
    body = {"limits": {"budget_usd": "2"}}
    first = await retry(auth, failed, body, **key)
    second = await retry(auth, failed, body, **key)
    assert second["id"] == first["id"]
    error_of(await c.post(f"/swarms/{failed}/retry", json={"limits": {"budget_usd": "3"}},
                          headers=key), 422, "idempotency_key_reused")
    error_of(await c.post("/swarms", json={"task": "t"}, headers=key), 422,
             "idempotency_key_reused")  # one key space with POST /swarms
    listed = (await c.get("/swarms", params={"retry_of": failed}, headers=T1)).json()
    assert [s["id"] for s in listed["items"]] == [first["id"]]
    again = await retry(auth, failed, body, **T1)  # without a key: a second retry
    assert again["id"] != first["id"]
    old = (await c.get(f"/swarms/{failed}", headers=T1)).json()
    assert old["retried_by"] == again["id"]  # the newest retry


async def test_compressors_are_reused_and_a_retry_can_be_retried(api: Harness) -> None:
    flags = api.simulator.state.config.flags
    flags.add("flaky")
    body = {"task": "t", "synthesis": {"strategy": "concatenate", "compress": "always"},
            "agents": [agent("a"), agent("b", FLAKY_400, depends_on=["a"])]}
    old = await api.run(body)
    assert old["status"] == "failed"
    assert by_name(old)["@compress.a"]["status"] == "succeeded"

    first = await api.wait((await retry(api, old["id"]))["id"])  # the fault is still there
    assert first["status"] == "failed"
    assert await sim_calls(api, first["id"]) == {"b": 1}  # a and its compression reused
    assert by_name(first)["@compress.a"]["reused"]

    flags.discard("flaky")
    second = await api.wait((await retry(api, first["id"]))["id"])
    assert second["status"] == "succeeded", second["error"]
    assert second["retry_of"] == first["id"] and first["retry_of"] == old["id"]
    assert await sim_calls(api, second["id"]) == {"b": 1}
    sent = (await api.stats())["by_key"][f"{second['id']}:b:1"]["last_messages"][-1]["content"]
    assert by_name(old)["@compress.a"]["output"] in sent  # the reused compression is the input
    lineage = [(await api.client.get(f"/swarms/{i}")).json()["retried_by"]
               for i in (old["id"], first["id"], second["id"])]
    assert lineage == [first["id"], second["id"], None]


def test_every_subtask_column_is_copied_or_reset() -> None:
    """A column added to `subtasks` must be classified: part of what a subtask is (copied
    into the retry) or of what it did (reset), or a retry would silently drop it."""
    columns = copy_columns("new", datetime.now(UTC))
    assert set(columns) == set(Subtask.__table__.c.keys()) - {"id"}


async def test_a_vote_synthesized_for_want_of_a_majority_is_synthesized_again(
        harness: Harness) -> None:
    """The synthesizer a vote added (no two answers agreed) failed: the retry counts the
    reused answers again and runs the copied synthesizer, not a second one."""
    harness.simulator.state.config.flags.add("flaky")
    # three different answers that carry the flaky directive: only the synthesizer's prompt,
    # which quotes them, fails while the flag is set
    body = {"task": "t", "agents": [agent(f"r{i}", f'[[sim answer="r{i} {FLAKY_400}"]]')
                                    for i in range(3)],
            "synthesis": {"strategy": "vote"}}
    first = await harness.run(body)
    assert first["status"] == "failed" and first["vote"]["outcome"] == "no_majority"
    assert first["subtasks"][-1]["status"] == "failed"
    harness.simulator.state.config.flags.discard("flaky")
    again = await harness.wait((await retry(harness, first["id"]))["id"])
    assert again["status"] == "succeeded", again["error"]
    assert again["vote"] == first["vote"]
    assert [s["name"] for s in again["subtasks"]] == ["r0", "r1", "r2", "@synthesizer"]
    assert [s["reused"] for s in again["subtasks"]] == [True, True, True, False]
    assert again["result"] == again["subtasks"][-1]["output"]
    assert await sim_calls(harness, again["id"]) == {"@synthesizer": 1}
