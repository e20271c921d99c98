"""Bounded answers (SPEC §4): a gateway answer is read up to a bound that follows the call's
max_tokens (a generous multiple of the bytes that many tokens take, at least 1 MiB); past it
the attempt is `invalid_response` at once and nothing of it is stored."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from sqlalchemy import select

from app.db.tables import GatewayCall, Subtask
from app.gateway.client import GatewayClient
from app.gateway.errors import GatewayUnavailable
from app.gateway.wire import ANSWER_FLOOR_BYTES, answer_limit, limit_of
from tests.conftest import Harness
from tests.gateway_support import REQUEST, ScriptedServer, completion, raw_answer
from tests.helpers import agent, by_name

MIB = 1024 * 1024


def test_the_bound_follows_max_tokens_with_a_floor() -> None:
    assert answer_limit(1500) == ANSWER_FLOOR_BYTES == MIB
    assert 4 * MIB < answer_limit(128_000) < 32 * MIB
    assert answer_limit(128_000, choices=2) == 2 * answer_limit(128_000)
    assert limit_of(json.dumps({"max_completion_tokens": 128_000, "n": 2}).encode()) \
        == answer_limit(128_000, 2)
    assert limit_of(b"not json") == limit_of(b"{}") == 32 * MIB  # no max_tokens: the old cap


async def test_over_the_network_a_short_calls_giant_answer_is_refused(
        waits: list[float]) -> None:
    giant = json.dumps(completion("x" * (2 * MIB))).encode()
    server = ScriptedServer(raw_answer("200 OK", giant), close=True)
    async with server as url:
        client = GatewayClient(url)
        try:
            with pytest.raises(GatewayUnavailable) as caught:
                await client.complete(replace(REQUEST, max_tokens=1500), max_attempts=2,
                                      timeout_s=5)
        finally:
            await client.aclose()
    assert [a.outcome for a in caught.value.attempts] == ["invalid_response"] * 2
    assert "over its bound" in (caught.value.attempts[0].error or "")


async def test_over_the_network_a_long_calls_large_answer_is_read(waits: list[float]) -> None:
    large = json.dumps(completion("y" * MIB)).encode()
    server = ScriptedServer(raw_answer("200 OK", large), close=True)
    async with server as url:
        client = GatewayClient(url)
        try:
            result = await client.complete(replace(REQUEST, max_tokens=128_000), timeout_s=5)
        finally:
            await client.aclose()
    assert len(result.content) == MIB


async def test_giant_answers_are_refused_beside_a_swarm_that_succeeds(harness: Harness) -> None:
    giant = {"task": "giant", "max_tokens": 1500, "synthesis": {"strategy": "none"},
             "agents": [agent(f"g{i}", f"[[sim answer_bytes={24 * MIB}]]") for i in range(2)]}
    normal = {"task": "normal", "max_tokens": 200, "agents": [agent("a"), agent("b")]}
    giant_id = (await harness.post(giant)).json()["id"]
    normal_id = (await harness.post(normal)).json()["id"]
    ok, refused = await harness.wait(normal_id), await harness.wait(giant_id)
    assert ok["status"] == "succeeded", ok
    assert refused["status"] == "failed", refused
    async with harness.app.state.sessions() as s:
        outcomes = set((await s.execute(select(GatewayCall.outcome).where(
            GatewayCall.swarm_id == giant_id))).scalars())
        outputs = list((await s.execute(select(Subtask.output).where(
            Subtask.swarm_id == giant_id))).scalars())
    # the first agent to fail fails the swarm (tolerance 0): the other's call in flight then,
    # if it is in flight rather than between attempts, ends cancelled
    assert "invalid_response" in outcomes and outcomes <= {"invalid_response", "cancelled"}
    assert outputs == [None, None]  # nothing of it stored


async def test_a_large_answer_to_a_long_call_is_stored(harness: Harness) -> None:
    body = {"task": "long", "max_tokens": 128_000, "synthesis": {"strategy": "none"},
            "agents": [agent("a", f"[[sim answer_bytes={MIB}]]")]}
    data = await harness.run(body)
    assert data["status"] == "succeeded", data
    r = await harness.client.get(f"/swarms/{data['id']}")
    assert len(by_name(r.json())["a"]["output"]) == MIB
