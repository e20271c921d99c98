"""The simulated gateway: answer shape, determinism, bad requests and auth, stats, configured
fault rates (its directives and plans: test_simulator_faults, test_simulator_plans)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from app.simulator import SimulatorConfig, create_simulator
from tests.simulator_support import URL, chat, content_of, sim_client

# --- the normal answer ---------------------------------------------------------------------------


async def test_answer_shape_and_usage(client: httpx.AsyncClient) -> None:
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Héllo wörld ✓ — explain DAG scheduling"}]
    resp = await client.post(URL, json={"model": "gpt-4.1", "messages": messages,
                                        "max_tokens": 300, "temperature": 0.3})
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "chat.completion" and body["model"] == "gpt-4.1"
    assert body["id"] and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].split("\n")[0].startswith("[gpt-4.1]")
    usage = body["usage"]
    chars = sum(len(m["content"]) for m in messages)
    utf8 = sum(len(m["content"].encode()) for m in messages)
    assert usage["prompt_tokens"] == math.ceil(chars / 4) + 4 * len(messages)
    assert usage["prompt_tokens"] <= utf8 + 8 * len(messages)
    assert 20 <= usage["completion_tokens"] <= 300
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert abs(len(choice["message"]["content"]) - 4 * usage["completion_tokens"]) <= 4


@pytest.mark.parametrize("max_tokens", [1, 7, 25])
async def test_completion_never_exceeds_max_tokens(
    client: httpx.AsyncClient, max_tokens: int
) -> None:
    for i in range(5):
        resp = await chat(client, f"question {i}", max_tokens=max_tokens)
        assert 1 <= resp.json()["usage"]["completion_tokens"] <= max_tokens


async def test_prompt_tokens_bound_holds_for_any_text(client: httpx.AsyncClient) -> None:
    for text in ["", "a", "ab", "漢字", "🙂" * 9, "x" * 1001]:
        resp = await chat(client, text)
        assert resp.json()["usage"]["prompt_tokens"] <= len(text.encode()) + 8


async def test_same_request_same_answer_across_instances(client: httpx.AsyncClient) -> None:
    first = await chat(client, "what is a swarm?", key="s1:a:1")
    again = await chat(client, "what is a swarm?", key="s1:b:1")
    async with sim_client(create_simulator(SimulatorConfig(latency_ms=0))) as other:
        elsewhere = await chat(other, "what is a swarm?")
    different = await chat(client, "what is a hive?")
    assert content_of(first) == content_of(again) == content_of(elsewhere)
    assert first.json()["usage"] == elsewhere.json()["usage"]
    assert content_of(different) != content_of(first)


async def test_models_route(client: httpx.AsyncClient) -> None:
    ids = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
    assert "kimi-k2.5" in ids and "deepseek-v3.2" in ids


# --- bad requests and auth -----------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    b"{not json", b"[1, 2]", b'{"messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "kimi-k2.5"}', b'{"model": "kimi-k2.5", "messages": []}',
    b'{"model": "kimi-k2.5", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
    b'{"model": "kimi-k2.5", "messages": [{"role": "user", "content": "[[sim nope=1]]"}]}',
    b'{"model": "kimi-k2.5", "messages": [{"role": "user", "content": "[[sim times=x]]"}]}',
    b'{"model": "kimi-k2.5", "messages": [{"role": "user", "content": "[[sim fail=200]]"}]}',
])
async def test_malformed_request_is_400(client: httpx.AsyncClient, body: bytes) -> None:
    resp = await client.post(URL, content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


async def test_api_key_is_enforced() -> None:
    app = create_simulator(SimulatorConfig(latency_ms=0, api_key="sekret"))
    async with sim_client(app) as c:
        body = {"model": "kimi-k2.5", "messages": [{"role": "user", "content": "hi"}]}
        missing = await c.post(URL, json=body)
        wrong = await c.post(URL, json=body, headers={"Authorization": "Bearer nope"})
        right = await c.post(URL, json=body, headers={"Authorization": "Bearer sekret"})
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    assert right.status_code == 200


# --- stats ---------------------------------------------------------------------------------------


async def test_stats_track_concurrency_per_swarm() -> None:
    async with sim_client(create_simulator(SimulatorConfig(latency_ms=80))) as c:
        keys = [f"swA:agent_{i}:1" for i in range(6)] + [f"swB:agent_{i}:1" for i in range(3)]
        resps = await asyncio.gather(*(chat(c, f"task {k}", key=k) for k in keys))
        assert all(r.status_code == 200 for r in resps)
        await chat(c, "[[sim fail=500]]", key="swA:late:1", model="deepseek-v3.2")
        stats = (await c.get("/v1/_stats")).json()
        assert stats["calls"] == 10 and stats["ok"] == 9
        assert stats["in_flight"] == 0 and stats["max_in_flight"] == 9
        assert stats["max_in_flight_by_swarm"] == {"swA": 6, "swB": 3}
        assert stats["by_model"] == {"kimi-k2.5": 9, "deepseek-v3.2": 1}
        entry = stats["by_key"]["swA:agent_0:1"]
        assert entry["calls"] == 1 and entry["ok"] == 1
        assert entry["last_messages"] == [{"role": "user", "content": "task swA:agent_0:1"}]
        late = stats["by_key"]["swA:late:1"]
        assert isinstance(late.pop("received_at"), float)
        assert late == {
            "calls": 1, "ok": 0, "last_messages": [{"role": "user", "content": "[[sim fail=500]]"}]}
        assert (await c.post("/v1/_reset")).status_code == 200
        cleared = (await c.get("/v1/_stats")).json()
    assert cleared["calls"] == 0 and cleared["by_key"] == {} and cleared["max_in_flight"] == 0


# --- configured fault rates ----------------------------------------------------------------------


async def test_rate_429_everywhere() -> None:
    app = create_simulator(SimulatorConfig(latency_ms=0, rate_429=1.0, retry_after_s=2))
    async with sim_client(app) as c:
        resps = [await chat(c, f"q{i}", key=f"s:a{i}:1") for i in range(10)]
    assert {r.status_code for r in resps} == {429}
    assert all(r.headers["retry-after"] == "2" for r in resps)


async def _statuses(seed: int, rate: float) -> list[int]:
    app = create_simulator(SimulatorConfig(latency_ms=0, rate_500=rate, seed=seed))
    async with sim_client(app) as c:
        return [(await chat(c, "q", key=f"s:a{i}:1")).status_code for i in range(200)]


async def test_rate_half_is_reproducible_and_retries_can_succeed() -> None:
    first, again, other = await _statuses(0, 0.5), await _statuses(0, 0.5), await _statuses(1, 0.5)
    assert 70 <= first.count(500) <= 130
    assert first == again and first != other
    app = create_simulator(SimulatorConfig(latency_ms=0, rate_500=0.5))
    async with sim_client(app) as c:
        retries = [(await chat(c, "q", key="s:retry:1")).status_code for _ in range(20)]
    assert 500 in retries and 200 in retries


@pytest.mark.parametrize(("field", "check"), [
    ("rate_500", lambda r: r.status_code == 500),
    ("rate_502_html", lambda r: r.status_code == 502 and "html" in r.headers["content-type"]),
    ("rate_truncated", lambda r: r.status_code == 200 and not r.text.endswith("}")),
    ("rate_length", lambda r: r.json()["choices"][0]["finish_reason"] == "length"),
    ("rate_timeout", lambda r: r.status_code == 200 and r.json()["usage"]),
])
async def test_each_configured_fault(field: str, check: Any) -> None:
    config = SimulatorConfig(latency_ms=0, timeout_s=0.01)
    setattr(config, field, 1.0)
    async with sim_client(create_simulator(config)) as c:
        resp = await chat(c, "q", max_tokens=50)
    assert check(resp)


async def test_when_blocks_apply_only_while_their_flag_is_set(
    app: Starlette, client: httpx.AsyncClient
) -> None:
    prompt = "q [[sim when=flaky fail=400]] [[sim when=other fail=503]]"
    assert (await chat(client, prompt, key="s:a:1")).status_code == 200
    app.state.config.flags.add("flaky")
    assert (await chat(client, prompt, key="s:a:1")).status_code == 400
    app.state.config.flags.add("other")  # a later block wins, as for any key
    assert (await chat(client, prompt, key="s:a:1")).status_code == 503
    app.state.config.flags.clear()
    assert (await chat(client, prompt, key="s:a:1")).status_code == 200


def test_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_SIM_LATENCY_MS", "5")
    monkeypatch.setenv("SWARM_SIM_RATE_429", "0.25")
    monkeypatch.setenv("SWARM_SIM_API_KEY", "k")
    monkeypatch.setenv("SWARM_SIM_SEED", "42")
    monkeypatch.setenv("SWARM_SIM_FLAGS", "flaky, slow")
    config = SimulatorConfig.from_env()
    assert (config.latency_ms, config.rate_429, config.api_key, config.seed) == (5, 0.25, "k", 42)
    assert config.flags == {"flaky", "slow"}
    with pytest.raises(ValueError):
        SimulatorConfig(rate_429=0.7, rate_500=0.7)


async def test_config_changes_apply_to_the_next_request(
    app: Starlette, client: httpx.AsyncClient
) -> None:
    assert (await chat(client, "q", key="s:a:1")).status_code == 200
    app.state.config.rate_429 = 1.0
    assert (await chat(client, "q", key="s:a:1")).status_code == 429
