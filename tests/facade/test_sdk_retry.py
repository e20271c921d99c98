"""An OpenAI SDK retry of a swarm request that a proxy timed out answers from the swarm already
running (SPEC §10): no second swarm, no second bill."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.facade.conftest import KEY, Facade
from tests.helpers import until

SLOW = {"model": "kimi-k2.5",
        "messages": [{"role": "user", "content": "Audit it [[sim latency_ms=1500]]"}],
        "agent_swarm": {"enabled": True, "max_sub_agents": 2,
                        "fan_in_strategy": "concatenate"}}


async def _swarms(facade: Facade) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await facade.http.get("/swarms")).json()["items"]
    return items


async def _cut_short(facade: Facade) -> None:
    """The first try, abandoned by its client (a proxy's read timeout) while the swarm runs."""
    before = len(await _swarms(facade))
    async with httpx.AsyncClient(base_url=facade.base_url, timeout=0.5,
                                 headers={"Authorization": f"Bearer {KEY}"}) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post("/v1/chat/completions", json=SLOW)
    # the swarm the abandoned request creates: on a loaded machine the client may give up
    # before the route has stored it
    await until(lambda: _more_than(facade, before), 10, "the abandoned request's swarm")


async def _more_than(facade: Facade, n: int) -> bool:
    return len(await _swarms(facade)) > n


async def test_a_retry_answers_from_the_swarm_already_running(facade: Facade) -> None:
    await _cut_short(facade)
    [first] = await _swarms(facade)
    r = await facade.http.post("/v1/chat/completions", json=SLOW,
                               headers={"x-stainless-retry-count": "1"})
    assert r.status_code == 200, r.text
    assert r.json()["swarm_id"] == first["id"]
    assert [s["id"] for s in await _swarms(facade)] == [first["id"]]


async def test_a_new_request_with_the_same_body_is_a_new_swarm(facade_sqlite: Facade) -> None:
    """Only the SDK's retry is matched: the same question asked again runs again."""
    await _cut_short(facade_sqlite)
    for count in ("0", None):
        headers = {} if count is None else {"x-stainless-retry-count": count}
        r = await facade_sqlite.http.post("/v1/chat/completions", json=SLOW, headers=headers)
        assert r.status_code == 200, r.text
    assert len(await _swarms(facade_sqlite)) == 3


async def test_another_body_or_tenant_is_not_matched(facade_sqlite: Facade) -> None:
    await _cut_short(facade_sqlite)
    other = {**SLOW, "temperature": 0.1}
    r = await facade_sqlite.http.post("/v1/chat/completions", json=other,
                                      headers={"x-stainless-retry-count": "1"})
    assert r.status_code == 200, r.text
    async with httpx.AsyncClient(base_url=facade_sqlite.base_url, timeout=30,
                                 headers={"Authorization": "Bearer k2"}) as t2:
        r2 = await t2.post("/v1/chat/completions", json=SLOW,
                           headers={"x-stainless-retry-count": "1"})
        assert r2.status_code == 200, r2.text
        assert len((await t2.get("/swarms")).json()["items"]) == 1
    assert len(await _swarms(facade_sqlite)) == 2  # t1's two, t2's own is its own


async def test_the_sdks_own_retries_start_no_second_swarm(facade_sqlite: Facade) -> None:
    """The official SDK, timing out at 0.5 s with two retries, runs one swarm, billed once."""
    sdk = facade_sqlite.sdk(timeout=0.5, max_retries=2)
    with pytest.raises(openai.APITimeoutError):
        await sdk.chat.completions.create(  # type: ignore[call-overload]
            model=SLOW["model"], messages=SLOW["messages"],
            extra_body={"agent_swarm": SLOW["agent_swarm"]})
    assert len(await _swarms(facade_sqlite)) == 1
