"""Idempotency-Key (SPEC §3): the same body is the same swarm, another body a 422, a bound on the
key's length; against real API processes on PostgreSQL, identical requests that arrive
together, at one replica or at two, create exactly one swarm."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Harness
from tests.helpers import agent, assert_rejected, error_of, swarm_count
from tests.procs import Db, cluster

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(90)]
N = 20
BODY = {"task": "exactly once", "agents": [agent("a"), agent("b")]}


async def burst(client: httpx.AsyncClient, apis: list[str], key: str,
                body: dict[str, Any]) -> list[httpx.Response]:
    """N identical POSTs sent at once (connections opened beforehand)."""
    go = asyncio.Event()

    async def one(i: int) -> httpx.Response:
        await go.wait()
        return await client.post(f"{apis[i % len(apis)]}/swarms", json=body,
                                 headers={"Idempotency-Key": key})

    tasks = [asyncio.create_task(one(i)) for i in range(N)]
    await asyncio.sleep(0)
    go.set()
    return list(await asyncio.gather(*tasks))


async def test_concurrent_identical_posts_create_one_swarm(db_url: str, tmp_path: Path) -> None:
    db = Db(db_url)
    async with cluster(db_url, tmp_path) as c:
        apis = list(await asyncio.gather(c.api("api_1"), c.api("api_2")))
        limits = httpx.Limits(max_connections=2 * N, max_keepalive_connections=2 * N)
        async with httpx.AsyncClient(timeout=20, limits=limits) as client:
            # open the connections first, so that the POSTs really arrive together
            await asyncio.gather(*(client.get(f"{apis[i % 2]}/healthz") for i in range(2 * N)))
            rounds = [([apis[0]], f"one-replica-{uuid.uuid4()}")]
            rounds += [(apis, f"two-replicas-{i}-{uuid.uuid4()}") for i in range(4)]
            for targets, key in rounds:
                responses = await burst(client, targets, key, BODY)
                assert {r.status_code for r in responses} == {202}, [r.text for r in responses]
                ids = {r.json()["id"] for r in responses}
                assert len(ids) == 1, ids
                assert {r.headers["location"] for r in responses} == {f"/swarms/{ids.pop()}"}
                rows = await db.fetch("SELECT id FROM swarms WHERE idempotency_key = $1", key)
                assert len(rows) == 1

            # every burst made one swarm with one set of subtasks
            assert len(await db.fetch("SELECT id FROM swarms")) == len(rounds)
            subtasks = await db.fetch("SELECT swarm_id, count(*) FROM subtasks GROUP BY swarm_id")
            assert sorted(r["count"] for r in subtasks) == [3] * len(rounds)  # a, b, synthesizer

            # the same key with another body is refused, on either replica
            key = rounds[-1][1]
            other = {**BODY, "task": "something else"}
            for api in apis:
                r = await client.post(f"{api}/swarms", json=other,
                                      headers={"Idempotency-Key": key})
                assert r.status_code == 422, r.text
                assert r.json()["error"]["code"] == "idempotency_key_reused"


# ---- Idempotency-Key ---------------------------------------------------------------------------


async def test_idempotency_same_body_same_swarm(api: Harness) -> None:
    key = {"Idempotency-Key": "order-42"}
    first = await api.post(BODY, headers=key)
    second = await api.post(BODY, headers=key)
    assert first.status_code == second.status_code == 202, second.text
    assert first.json()["id"] == second.json()["id"]
    assert second.headers["location"] == f"/swarms/{first.json()['id']}"
    assert await swarm_count(api.client) == 1
    other = await api.post(BODY, headers={"Idempotency-Key": "order-43"})
    assert other.json()["id"] != first.json()["id"]
    assert (await api.post(BODY)).json()["id"] not in {first.json()["id"], other.json()["id"]}
    assert await swarm_count(api.client) == 3


async def test_idempotency_different_body_is_422(api: Harness) -> None:
    key = {"Idempotency-Key": "order-42"}
    first = await api.post(BODY, headers=key)
    r = await api.post({**BODY, "task": "something else"}, headers=key)
    err = error_of(r, 422, "idempotency_key_reused")
    assert err["details"]["field"] == "Idempotency-Key"
    assert await swarm_count(api.client) == 1
    assert (await api.post(BODY, headers=key)).json()["id"] == first.json()["id"]


async def test_idempotency_concurrent_requests_make_one_swarm(api: Harness) -> None:
    key = {"Idempotency-Key": "burst"}
    answers = await asyncio.gather(*(api.post(BODY, headers=key) for _ in range(20)))
    assert {r.status_code for r in answers} == {202}, [r.text for r in answers]
    assert len({r.json()["id"] for r in answers}) == 1
    assert await swarm_count(api.client) == 1


async def test_idempotency_key_length(api: Harness) -> None:
    r = await api.post(BODY, headers={"Idempotency-Key": "k" * 256})
    assert_rejected(r, 422, "validation_error", "Idempotency-Key")
    r = await api.post(BODY, headers={"Idempotency-Key": ""})
    assert_rejected(r, 422, "validation_error", "Idempotency-Key")
    assert await swarm_count(api.client) == 0
    r = await api.post(BODY, headers={"Idempotency-Key": "k" * 255})
    assert r.status_code == 202, r.text
