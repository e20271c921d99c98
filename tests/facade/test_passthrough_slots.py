"""A passthrough call (no `agent_swarm`) holds one of its tenant's `max_inflight_calls` and one
`SWARM_MAX_INFLIGHT` slot like an engine call (SPEC §10): a tenant's calls beyond its limit
wait (the gateway never sees more), so they cannot take the process's pool from another
tenant's swarm; a wait longer than SWARM_FACADE_TIMEOUT_S is a 429, and a caller that leaves
while it waits is never sent."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.gateway.client import GatewayClient
from app.simulator import SimulatorConfig, create_simulator
from tests.facade.conftest import KEY, Facade, start_facade
from tests.facade.live import serving
from tests.helpers import until


def _body(latency_ms: int, text: str = "Name a risk") -> dict[str, Any]:
    return {"model": "deepseek-v3.2", "max_tokens": 50,
            "messages": [{"role": "user", "content": f"{text} [[sim latency_ms={latency_ms}]]"}]}


def tenants(tmp_path: Path, text: str) -> str:
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    return str(path)


async def _call(facade: Facade, body: dict[str, Any], stream: bool, key: str = KEY) -> str:
    """One passthrough call through the OpenAI SDK (no retries); its answer's text."""
    sdk = openai.AsyncOpenAI(base_url=f"{facade.base_url}/v1", api_key=key, max_retries=0)
    if not stream:
        completion = await sdk.chat.completions.create(**body)
        return completion.choices[0].message.content or ""
    chunks = [c async for c in await sdk.chat.completions.create(**body, stream=True)]
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def test_a_tenants_passthrough_calls_in_flight_are_bounded(database_url: str,
                                                                 tmp_path: Path) -> None:
    """20 concurrent calls (half of them streamed) of a tenant with max_inflight_calls = 2:
    all answered, never more than 2 at the gateway (it saw 20 before)."""
    async with start_facade(database_url, tenants_file=tenants(
            tmp_path, "[tenants.t1]\nmax_inflight_calls = 2\n")) as facade:
        texts = await asyncio.gather(*(_call(facade, _body(200, f"Risk {i}"), stream=i % 2 == 1)
                                       for i in range(20)))
        assert all(texts)
        stats = facade.simulator.state.stats
        assert stats.max_in_flight == 2
        assert stats.calls == 20 and stats.in_flight == 0
        usage = await facade.usage()
        assert sum(i["gateway_calls"] for i in usage["items"]) == 20  # each billed once


async def test_an_api_replicas_passthrough_calls_hold_its_process_pool(
        sqlite_url: str) -> None:
    """Without an engine in the process, SWARM_MAX_INFLIGHT still bounds its calls."""
    async with start_facade(sqlite_url, run_engine=False, max_inflight=3) as facade:
        texts = await asyncio.gather(*(_call(facade, _body(150), stream=i % 2 == 0)
                                       for i in range(9)))
        assert all(texts)
        assert facade.simulator.state.stats.max_in_flight == 3


async def test_a_call_that_waits_longer_than_the_facade_timeout_is_refused(
        sqlite_url: str, tmp_path: Path) -> None:
    """One slot, calls of 1.5 s, SWARM_FACADE_TIMEOUT_S = 2: the third waits from 0 to 3 s
    for its slot, more than 2 s: 429 quota_exceeded naming the tenant's limit, never sent."""
    async with start_facade(sqlite_url, facade_timeout_s=2.0, tenants_file=tenants(
            tmp_path, "[tenants.t1]\nmax_inflight_calls = 1\n")) as facade:
        answers = await asyncio.gather(
            *(facade.http.post("/v1/chat/completions", json=_body(1500, f"Risk {i}"))
              for i in range(3)))
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200, 200, 429], [r.text for r in answers]
        refused = next(r for r in answers if r.status_code == 429)
        error = refused.json()["error"]
        assert error["code"] == "quota_exceeded" and error["type"] == "rate_limit_error"
        assert "in flight" in error["message"]
        assert refused.headers["retry-after"] == "1"
        assert facade.simulator.state.stats.calls == 2
        metrics = (await facade.http.get("/metrics")).text
        assert 'swarm_quota_denials_total{limit="max_inflight_calls"} 1.0' in metrics


async def test_a_caller_gone_while_waiting_is_never_sent(sqlite_url: str,
                                                         tmp_path: Path) -> None:
    async with start_facade(sqlite_url, tenants_file=tenants(
            tmp_path, "[tenants.t1]\nmax_inflight_calls = 1\n")) as facade:
        held = asyncio.create_task(_call(facade, _body(1500, "Held"), stream=False))
        await until(lambda: facade.simulator.state.stats.in_flight == 1, 10, "the held call")
        async with httpx.AsyncClient(base_url=facade.base_url, timeout=0.3,
                                     headers={"Authorization": f"Bearer {KEY}"}) as c:
            for stream in (False, True):
                with pytest.raises(httpx.ReadTimeout):
                    await c.post("/v1/chat/completions", json={**_body(20), "stream": stream})
        assert await held
        # the slot is free at once for the next call, and the gone ones were never sent
        started = time.monotonic()
        assert await _call(facade, _body(20, "Next"), stream=False)
        assert time.monotonic() - started < 1.0
        assert facade.simulator.state.stats.calls == 2
        usage = await facade.usage()
        assert sum(i["gateway_calls"] for i in usage["items"]) == 2


async def _victim_seconds(facade: Facade) -> float:
    """Another tenant's one-call swarm, posted and waited for, in seconds."""
    body = {"task": "t", "agents": [{"name": "a"}], "synthesis": {"strategy": "none"}}
    async with httpx.AsyncClient(base_url=facade.base_url, timeout=60,
                                 headers={"Authorization": "Bearer k2"}) as t2:
        started = time.monotonic()
        r = await t2.post("/swarms", json=body)
        assert r.status_code == 202, r.text
        data = (await t2.get(f"/swarms/{r.json()['id']}", params={"wait": 30})).json()
        elapsed = time.monotonic() - started
    assert data["status"] == "succeeded", data
    return elapsed


async def test_another_tenants_swarm_keeps_its_latency_beside_a_flood(
        database_url: str, tmp_path: Path) -> None:
    """SWARM_MAX_INFLIGHT = 4 and a gateway served over HTTP (its pool of 4 connections):
    t1 (max_inflight_calls = 2) floods it with 10 calls of 4 s; t2's one-call swarm stays
    within 2x of its time alone (it waited for the flood's connections before)."""
    # calls of 600 ms alone: the latency measured is the gateway's, not the noise of a busy machine
    simulator = create_simulator(SimulatorConfig(latency_ms=600))
    async with serving(simulator) as sim_url:
        gateway = GatewayClient(f"{sim_url}/v1", max_inflight=4)
        async with start_facade(database_url, gateway_app=simulator, gateway=gateway,
                                max_inflight=4, tenants_file=tenants(
                                    tmp_path, "[tenants.t1]\nmax_inflight_calls = 2\n")
                                ) as facade:
            alone = min([await _victim_seconds(facade) for _ in range(2)])
            # buffered calls, as the engine's are: the pool they would share
            flood = [asyncio.create_task(_call(facade, _body(4000, f"Flood {i}"), stream=False))
                     for i in range(10)]
            await until(lambda: simulator.state.stats.in_flight >= 2, 10, "the flood")
            await asyncio.sleep(0.3)  # the rest of it sent (or waiting for its slots)
            beside = await _victim_seconds(facade)
            most = simulator.state.stats.max_in_flight
            for task in flood:
                task.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
    assert beside <= 2 * alone, (alone, beside)
    assert most <= 3  # t1's 2 and t2's 1


async def test_a_call_that_waits_for_the_process_pool_too_long_is_503(sqlite_url: str) -> None:
    """SWARM_MAX_INFLIGHT = 1 on an API replica, calls of 1.5 s by two tenants without a
    limit of their own, SWARM_FACADE_TIMEOUT_S = 2: the third call waits more than 2 s for
    the process's slot -> 503 overloaded (Retry-After), never sent."""
    async with start_facade(sqlite_url, run_engine=False, max_inflight=1,
                            facade_timeout_s=2.0) as facade:
        async with httpx.AsyncClient(base_url=facade.base_url, timeout=30,
                                     headers={"Authorization": "Bearer k2"}) as t2:
            answers = await asyncio.gather(
                facade.http.post("/v1/chat/completions", json=_body(1500, "One")),
                t2.post("/v1/chat/completions", json=_body(1500, "Two")),
                facade.http.post("/v1/chat/completions", json=_body(1500, "Three")))
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200, 200, 503], [r.text for r in answers]
        refused = next(r for r in answers if r.status_code == 503)
        assert refused.json()["error"]["code"] == "overloaded"
        assert refused.headers["retry-after"] == "1"
        assert facade.simulator.state.stats.calls == 2
        assert facade.simulator.state.stats.max_in_flight == 1
