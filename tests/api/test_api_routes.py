"""SPEC §3 routes: create, read (?wait=), list, cancel. Their events, Idempotency-Key, auth and
the ops routes have modules of their own (test_events, test_idempotency, test_api_keys,
test_ops_routes)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import httpx
import pytest

from app.db import queries
from app.db.live_rows import SubtaskView
from app.db.tables import Swarm
from app.schemas import SwarmRead
from app.views import swarm_fields, swarm_json
from tests.conftest import Harness
from tests.helpers import (
    BODY,
    SLOW,
    UNKNOWN_ID,
    agent,
    assert_rejected,
    error_of,
    read_events,
    until,
)

SWARM_KEYS = {"id", "status", "created_at", "started_at", "finished_at", "task", "metadata",
              "spec", "progress", "subtasks", "usage", "timing", "queue_position", "result",
              "error"}
SUBTASK_KEYS = {"name", "kind", "status", "model", "depends_on", "attempts", "output", "error",
                "usage", "latency_ms", "started_at", "finished_at"}
PROGRESS_KEYS = {"total", "pending", "running", "succeeded", "failed", "skipped", "cancelled"}
TERMINAL = {"succeeded", "failed", "cancelled"}


def assert_swarm_shape(data: dict[str, Any]) -> None:
    assert SWARM_KEYS <= set(data), SWARM_KEYS - set(data)
    uuid.UUID(data["id"])
    assert set(data["progress"]) == PROGRESS_KEYS
    assert data["progress"]["total"] == len(data["subtasks"])
    assert sum(data["progress"][k] for k in PROGRESS_KEYS - {"total"}) == data["progress"]["total"]
    assert set(data["usage"]) >= {"prompt_tokens", "completion_tokens", "cost_usd",
                                  "gateway_calls"}
    for money in [data["usage"]["cost_usd"], *(s["usage"]["cost_usd"] for s in data["subtasks"])]:
        assert isinstance(money, str)
        assert Decimal(money) >= 0  # a decimal string, exact
    assert set(data["timing"]) >= {"wall_s", "critical_path_s", "serial_s", "speedup",
                                   "subtask_latency_s"}
    for s in data["subtasks"]:
        assert SUBTASK_KEYS <= set(s), SUBTASK_KEYS - set(s)
        assert s["kind"] in {"planner", "worker", "compressor", "synthesizer"}
        assert s["status"] in {"pending", "running", "succeeded", "failed", "skipped",
                               "cancelled"}
        assert set(s["usage"]) >= {"prompt_tokens", "completion_tokens", "cost_usd"}


async def wait_for_subtask(client: httpx.AsyncClient, swarm_id: str, name: str,
                           status: str, timeout: float = 10) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        data: dict[str, Any] = (await client.get(f"/swarms/{swarm_id}")).json()
        return data if any(s["name"] == name and s["status"] == status
                           for s in data["subtasks"]) else None

    return await until(reached, timeout, f"{name} to be {status}", every=0.02)


# ---- create and read ---------------------------------------------------------------------------


async def test_create_answers_202_with_location_and_the_swarm(api: Harness) -> None:
    r = await api.post(BODY)
    assert r.status_code == 202, r.text
    data = r.json()
    assert r.headers["location"] == f"/swarms/{data['id']}"
    assert_swarm_shape(data)
    assert data["status"] in {"queued", "planning", "running", "synthesizing", *TERMINAL}
    assert data["task"] == BODY["task"]
    assert data["metadata"] == {"ticket": "PAY-1234"}
    assert [s["name"] for s in data["subtasks"]] == ["analyst", "auditor", "writer",
                                                      "@synthesizer"]
    assert data["subtasks"][2]["depends_on"] == ["analyst", "auditor"]
    assert data["subtasks"][1]["model"] == "deepseek-v3.2"
    assert data["subtasks"][0]["model"] == "kimi-k2.5"  # the default model
    got = await api.client.get(r.headers["location"])
    assert got.status_code == 200 and got.json()["id"] == data["id"]


async def test_spec_is_normalised(api: Harness) -> None:
    data = (await api.post({"task": "t", "agents": [{"name": "a"}]})).json()
    spec = data["spec"]
    assert spec["task"] == "t"
    assert spec["model"] == "kimi-k2.5"
    assert spec["synthesis"]["model"] == "kimi-k2.5"
    assert spec["synthesis"]["strategy"] == "synthesize"
    assert spec["synthesis"]["max_tokens"] == spec["max_tokens"] == 1500
    assert spec["orchestrator"]["model"] == "kimi-k2.5"
    assert spec["limits"]["concurrency"] >= 1 and spec["limits"]["max_attempts"] >= 1
    explicit = (await api.post({"task": "t", "agents": [{"name": "a"}], "model": "gpt-4.1",
                                "limits": {"budget_usd": 1.25}})).json()["spec"]
    assert explicit["model"] == explicit["synthesis"]["model"] == "gpt-4.1"
    assert Decimal(explicit["limits"]["budget_usd"]) == Decimal("1.25")


async def test_finished_swarm_has_outputs_usage_and_timing(api: Harness) -> None:
    data = await api.run(BODY)
    assert data["status"] == "succeeded", data["error"]
    assert_swarm_shape(data)
    assert data["finished_at"] and data["started_at"] and data["result"]
    assert all(s["output"] and s["attempts"] == 1 for s in data["subtasks"])
    assert Decimal(data["usage"]["cost_usd"]) == sum(
        Decimal(s["usage"]["cost_usd"]) for s in data["subtasks"])
    assert data["usage"]["gateway_calls"] == 4
    assert data["queue_position"] is None and data["error"] is None


def as_model(swarm: Swarm, subs: Sequence[SubtaskView], **kw: Any) -> bytes:
    """The view as SwarmRead itself serializes it (what `swarm_json` must equal byte for
    byte: it skips building the models)."""
    return SwarmRead.model_validate(swarm_fields(swarm, subs, **kw)).model_dump_json().encode()


async def test_views_from_core_rows_equal_views_from_orm_objects(harness: Harness) -> None:
    """Reads build views from `queries.subtask_views` tuples; creation and the engine from
    ORM objects: one swarm must look the same either way (with outputs and without), and
    exactly as SwarmRead would serialize it."""
    body = {**BODY, "agents": [*BODY["agents"], {"name": "broken", "max_tokens": 10,
                                                 "system_prompt": "[[sim status=400]]"}]}
    swarm_id = (await harness.run(body))["id"]
    async with harness.app.state.sessions() as s, s.begin():
        swarm = await queries.get_swarm(s, swarm_id, None)
        assert swarm is not None
        orm = (await queries.get_subtasks(s, [swarm_id]))[swarm_id]
        rows = (await queries.subtask_views(s, [swarm_id]))[swarm_id]
        listed = (await queries.subtask_views(s, [swarm_id], outputs=False))[swarm_id]
    assert {r.status for r in rows} == {"succeeded", "failed", "skipped"}  # the synthesizer
    assert any(r.error for r in rows) and any(r.depends_on for r in rows)
    for outputs in (True, False):
        view = swarm_json(swarm, rows, with_outputs=outputs)
        assert view == swarm_json(swarm, orm, with_outputs=outputs)
        assert view == swarm_json(swarm, queries.rows_of(orm), with_outputs=outputs)
        assert view == as_model(swarm, rows, with_outputs=outputs)
    partial = orm[0]
    del partial.__dict__["output"]  # not loaded: read through getattr
    assert queries.rows_of([partial])[0] == rows[0]._replace(output=partial.output)
    assert (swarm_json(swarm, listed, with_outputs=False)
            == swarm_json(swarm, orm, with_outputs=False)
            == as_model(swarm, listed, with_outputs=False))
    # what a client may put in metadata: numbers JSON allows but floats cannot hold, text
    # beyond ASCII; and a view with every optional part set
    swarm.meta = {"big": 2**80, "huge": float("inf"), "neg": -1e-300, "text": "ünï\u2028😀",
                  "nested": [None, True, {"": 1.5}]}
    swarm.error = {"code": "x", "message": "y", "details": {"n": 1}}
    kw: dict[str, Any] = {"queue_position": 3, "retried_by": str(uuid.uuid4()),
                          "with_result": True}
    assert swarm_json(swarm, rows, **kw) == as_model(swarm, rows, **kw)
    assert json.loads(swarm_json(swarm, rows, **kw))["metadata"]["huge"] is None
    assert all(r.output is None for r in listed) and all(r.output for r in rows
                                                        if r.status == "succeeded")


@pytest.mark.parametrize("swarm_id", [UNKNOWN_ID, "nope", "a%00b", "%FF", "x" * 300])
async def test_unknown_or_malformed_id_is_404(api: Harness, swarm_id: str) -> None:
    for method, path in (("GET", f"/swarms/{swarm_id}"),
                         ("GET", f"/swarms/{swarm_id}?wait=30"),  # answered at once
                         ("POST", f"/swarms/{swarm_id}/cancel"),
                         ("GET", f"/swarms/{swarm_id}/events")):
        started = time.monotonic()
        r = await api.client.request(method, path)
        error_of(r, 404, "not_found")
        assert time.monotonic() - started < 5  # not held for a swarm that is not there


async def test_wait_bounds(api: Harness) -> None:
    sid = (await api.run({"task": "t", "agents": [{"name": "a"}]}))["id"]
    for ok in ("0", "0.5", "60"):
        r = await api.client.get(f"/swarms/{sid}", params={"wait": ok})
        assert r.status_code == 200, r.text
    for bad in ("61", "-1", "abc", "nan"):
        r = await api.client.get(f"/swarms/{sid}", params={"wait": bad})
        assert_rejected(r, 422, "validation_error", "wait")


async def test_wait_returns_when_terminal(api: Harness) -> None:
    r = await api.post({"task": "t",
                        "agents": [{"name": "a", "system_prompt": "[[sim latency_ms=300]]"}]})
    sid = r.json()["id"]
    start = time.monotonic()
    r = await api.client.get(f"/swarms/{sid}", params={"wait": 5})
    elapsed = time.monotonic() - start
    assert r.status_code == 200
    assert r.json()["status"] == "succeeded"
    assert 0.25 < elapsed < 3, elapsed


async def test_wait_asks_the_database_only_when_a_commit_ended_the_swarm(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """`?wait=` is woken by every commit of its swarm, and each says the swarm's status:
    the status is read once, at the start; the commit that ended the swarm said so."""
    reads = 0
    read = queries.get_status

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await read(*args, **kwargs)

    monkeypatch.setattr(queries, "get_status", counted)
    body = {"task": "t", "limits": {"concurrency": 2},
            "agents": [agent(f"a{i}", "[[sim latency_ms=30]]") for i in range(20)]}
    sid = (await harness.post(body)).json()["id"]
    r = await harness.client.get(f"/swarms/{sid}", params={"wait": 30})
    assert r.json()["status"] == "succeeded"
    assert reads == 1, reads  # ten or more commits woke it


async def test_wait_zero_does_not_hold(api: Harness) -> None:
    sid = (await api.post({"task": "t", "agents": [{"name": "a", "system_prompt": SLOW}]})
           ).json()["id"]
    start = time.monotonic()
    r = await api.client.get(f"/swarms/{sid}", params={"wait": 0})
    assert r.status_code == 200 and r.json()["status"] not in TERMINAL
    assert time.monotonic() - start < 1
    start = time.monotonic()
    r = await api.client.get(f"/swarms/{sid}", params={"wait": 0.5})
    assert r.json()["status"] not in TERMINAL
    assert 0.4 < time.monotonic() - start < 2.5
    await api.client.post(f"/swarms/{sid}/cancel")


# ---- list --------------------------------------------------------------------------------------


async def test_list_newest_first_paged_filtered_without_outputs(api: Harness) -> None:
    ids = [(await api.run({"task": f"t{i}", "agents": [{"name": "a"}]}))["id"] for i in range(4)]
    failed = await api.run({"task": "t", "agents": [
        {"name": "a", "system_prompt": "[[sim fail=400]]"}]})
    assert failed["status"] == "failed", failed
    ids.append(failed["id"])
    newest_first = ids[::-1]

    r = await api.client.get("/swarms")
    assert r.status_code == 200
    page = r.json()
    assert set(page) == {"items", "next_cursor"}
    assert [s["id"] for s in page["items"]] == newest_first
    assert page["next_cursor"] is None
    for item in page["items"]:
        assert_swarm_shape(item)
        assert item["result"] is None
        assert all(s["output"] is None for s in item["subtasks"])

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = (await api.client.get("/swarms", params=params)).json()
        pages += 1
        assert len(page["items"]) <= 2
        seen += [s["id"] for s in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert pages < 10
    assert seen == newest_first and pages == 3

    r = await api.client.get("/swarms", params={"status": "failed"})
    assert [s["id"] for s in r.json()["items"]] == [failed["id"]]
    r = await api.client.get("/swarms", params={"status": "succeeded"})
    assert [s["id"] for s in r.json()["items"]] == newest_first[1:]
    r = await api.client.get("/swarms", params={"status": "queued"})
    assert r.json() == {"items": [], "next_cursor": None}


@pytest.mark.parametrize(("params", "code", "field"), [
    ({"status": "done"}, "validation_error", "status"),
    ({"limit": 0}, "validation_error", "limit"),
    ({"limit": 201}, "validation_error", "limit"),
    ({"limit": "x"}, "validation_error", "limit"),
    ({"cursor": "not-a-cursor"}, "invalid_cursor", "cursor"),
    ({"cursor": "eyJ4IjoxfQ"}, "invalid_cursor", "cursor"),
    ({"cursor": "x" * 501}, "validation_error", "cursor"),
])
async def test_list_rejects_bad_params(api: Harness, params: dict[str, Any], code: str,
                                       field: str) -> None:
    r = await api.client.get("/swarms", params=params)
    assert_rejected(r, 422, code, field)


async def test_list_limit_bounds_accepted(api: Harness) -> None:
    for limit in (1, 200):
        r = await api.client.get("/swarms", params={"limit": limit})
        assert r.status_code == 200, r.text


# ---- cancel ------------------------------------------------------------------------------------


async def test_cancel_running_swarm(api: Harness) -> None:
    body = {"task": "t", "agents": [
        {"name": "fast"},
        {"name": "slow", "system_prompt": SLOW},
        {"name": "after", "depends_on": ["slow"]}]}
    sid = (await api.post(body)).json()["id"]
    await wait_for_subtask(api.client, sid, "slow", "running")
    await wait_for_subtask(api.client, sid, "fast", "succeeded")

    start = time.monotonic()
    r = await api.client.post(f"/swarms/{sid}/cancel")
    assert r.status_code == 202, r.text
    assert_swarm_shape(r.json())
    assert r.json()["id"] == sid
    data = (await api.client.get(f"/swarms/{sid}", params={"wait": 5})).json()
    assert data["status"] == "cancelled"
    assert time.monotonic() - start < 2  # the 3 s call did not run to its end
    status = {s["name"]: s["status"] for s in data["subtasks"]}
    assert status == {"fast": "succeeded", "slow": "cancelled", "after": "cancelled",
                      "@synthesizer": "cancelled"}
    assert data["subtasks"][0]["output"]  # finished outputs stay
    assert data["progress"]["cancelled"] == 3

    again = await api.client.post(f"/swarms/{sid}/cancel")
    err = error_of(again, 409, "already_terminal")
    assert err["details"]["status"] == "cancelled"
    events = await read_events(api.client, sid)
    assert events[-1]["event"] == "swarm.completed"
    assert events[-1]["data"]["status"] == "cancelled"


async def test_cancel_finished_swarm_is_409(api: Harness) -> None:
    sid = (await api.run({"task": "t", "agents": [{"name": "a"}]}))["id"]
    error_of(await api.client.post(f"/swarms/{sid}/cancel"), 409, "already_terminal")
    assert (await api.client.get(f"/swarms/{sid}")).json()["status"] == "succeeded"
