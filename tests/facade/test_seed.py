"""Seed 001's three programs (tests/seed_001: verbatim but for base_url and api_key) run
against the facade with the official OpenAI SDK: real swarms, usage equal to the swarm's, the
swarm readable at /swarms/{id}; a streaming client that leaves does not stop its swarm."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import text

from app.runtime import Runtime
from tests.conftest import BACKENDS, make_settings
from tests.facade.conftest import KEY, Facade, start_facade
from tests.mcp_servers import HttpServer, calls, write_config

SEED = Path(__file__).parent / "seed_001"


def load_seed(name: str, facade: Facade, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import one seed program afresh (its client reads the two variables at import)."""
    monkeypatch.setenv("SWARM_API_KEY", KEY)
    monkeypatch.setenv("SWARM_FACADE_URL", f"{facade.base_url}/v1")
    spec = importlib.util.spec_from_file_location(f"seed_001_{name}", SEED / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def usage_of(swarm: dict[str, Any]) -> tuple[int, int]:
    return swarm["usage"]["prompt_tokens"], swarm["usage"]["completion_tokens"]


async def latest_swarms(facade: Facade, n: int) -> list[dict[str, Any]]:
    r = await facade.http.get("/swarms", params={"limit": n})
    assert r.status_code == 200, r.text
    return [await facade.swarm(s["id"]) for s in r.json()["items"]]


async def test_seed_basic_call_runs_a_weighted_vote_swarm(
        facade: Facade, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    seed = load_seed("kimi_swarm_basic", facade, monkeypatch)
    await seed.main()  # what `python kimi_swarm_basic.py` runs
    printed = capsys.readouterr().out.strip()
    (swarm,) = await latest_swarms(facade, 1)
    assert swarm["status"] == "succeeded"
    assert printed == swarm["result"].strip() and printed
    spec = swarm["spec"]
    assert spec["synthesis"]["strategy"] == "vote"  # weighted_vote
    assert spec["orchestrator"]["max_subtasks"] == 100
    assert spec["limits"]["failure_tolerance"] == 0.02
    assert spec["synthesis"]["max_tokens"] == 4096 and spec["temperature"] == 0.3
    assert "루트 오케스트레이터" in spec["orchestrator"]["system_prompt"]  # the system message
    assert "보안 취약점" in swarm["task"]  # the user message is the task
    kinds = [s["kind"] for s in swarm["subtasks"]]
    assert kinds[0] == "planner" and kinds.count("worker") >= 2


async def test_completion_usage_is_the_swarms(facade: Facade) -> None:
    client = facade.sdk()
    raw = await client.chat.completions.with_raw_response.create(
        model="kimi-k2.5", messages=[{"role": "user", "content": "Audit the payment service"}],
        extra_body={"agent_swarm": {"enabled": True, "max_sub_agents": 5,
                                    "fan_in_strategy": "concatenate",
                                    "per_sub_agent_max_tokens": 200}})
    completion = raw.parse()
    body = raw.http_response.json()
    swarm = await facade.swarm(body["swarm_id"])
    assert completion.id == f"chatcmpl-{swarm['id']}"
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content == swarm["result"]
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == \
        usage_of(swarm)
    assert completion.usage.total_tokens == sum(usage_of(swarm))
    assert body["usage"]["cost_usd"] == swarm["usage"]["cost_usd"]
    workers = [s for s in swarm["subtasks"] if s["kind"] == "worker"]
    assert workers and all(s["status"] == "succeeded" for s in workers)
    # per_sub_agent_max_tokens bounds each worker's answer; the planner honoured max_sub_agents
    assert len(workers) <= 5 and swarm["spec"]["orchestrator"]["max_subtasks"] == 5
    assert all(s["usage"]["completion_tokens"] <= 200 for s in workers)
    assert swarm["metadata"] == {"source": "openai.chat.completions"}


async def test_seed_throttled_batch_runs_five_swarms(
        facade: Facade, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    seed = load_seed("kimi_swarm_throttled", facade, monkeypatch)
    ok = await seed.batch_review([f"파일 #{i}: 다음 코드를 검토하라..." for i in range(5)])
    assert len(ok) == 5, capsys.readouterr().out
    assert "성공 5건, 실패 0건" in capsys.readouterr().out
    swarms = await latest_swarms(facade, 5)
    assert all(s["status"] == "succeeded" for s in swarms)
    # each answer's usage is its swarm's: the seed's cost guard adds up exactly those tokens
    results = {content: usage for content, usage in ok}
    for s in swarms:
        usage = results[s["result"]]
        assert (usage.prompt_tokens, usage.completion_tokens) == usage_of(s)


async def test_seed_streaming_frames_every_worker(
        facade: Facade, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = load_seed("kimi_swarm_streaming", facade, monkeypatch)
    sub_results = await seed.streaming_swarm("100개의 일반적인 API 설계 안티패턴을 나열하라.")
    (swarm,) = await latest_swarms(facade, 1)
    assert swarm["status"] == "succeeded"
    workers = {s["name"]: s["output"].strip() for s in swarm["subtasks"]
               if s["kind"] == "worker"}
    assert len(workers) >= 2
    # the seed's own `[SUB_AGENT_` loop recovered every worker's output, named
    assert {r["agent"]: r["result"] for r in sub_results} == workers
    assert swarm["spec"]["synthesis"]["strategy"] == "concatenate"


async def test_stream_ends_with_result_usage_and_done(facade: Facade) -> None:
    client = facade.sdk()
    stream = await client.chat.completions.create(
        model="kimi-k2.5", messages=[{"role": "user", "content": "Plan a migration"}],
        extra_body={"agent_swarm": {"enabled": True, "fan_in_strategy": "majority"}},
        stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    swarm_id = chunks[0].id.removeprefix("chatcmpl-")
    swarm = await facade.swarm(swarm_id)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.endswith(swarm["result"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == usage_of(swarm)


async def test_a_client_that_leaves_does_not_stop_the_swarm(facade: Facade) -> None:
    facade.simulator.state.config.latency_ms = 300  # the swarm is still running when we leave
    client = facade.sdk()
    stream = await client.chat.completions.create(
        model="kimi-k2.5", messages=[{"role": "user", "content": "Write the release notes"}],
        extra_body={"agent_swarm": {"enabled": True}}, stream=True)
    first = await anext(aiter(stream))
    await stream.close()  # the client goes away after the first chunk
    swarm_id = first.id.removeprefix("chatcmpl-")
    assert (await facade.swarm(swarm_id))["status"] not in ("succeeded", "failed", "cancelled")
    r = await facade.http.get(f"/swarms/{swarm_id}", params={"wait": 20})
    assert r.json()["status"] == "succeeded", r.json()
    assert r.json()["result"]


async def test_waiting_request_answers_after_the_swarm_ends(facade: Facade) -> None:
    """A plain request waits for a slower swarm (several gateway round trips)."""
    facade.simulator.state.config.latency_ms = 100
    client = facade.sdk()
    completion, _ = await asyncio.gather(
        client.chat.completions.create(
            model="deepseek-v3.2", messages=[{"role": "user", "content": "Summarise the logs"}],
            extra_body={"agent_swarm": {"enabled": True}}),
        asyncio.sleep(0))
    swarm = await facade.swarm(completion.model_extra["swarm_id"])  # type: ignore[index]
    assert swarm["status"] == "succeeded"
    assert swarm["spec"]["synthesis"]["strategy"] == "synthesize"  # no fan_in_strategy
    assert completion.choices[0].message.content == swarm["result"]
    assert completion.model == "deepseek-v3.2"


@pytest.mark.skipif("postgres" not in BACKENDS, reason="SWARM_TEST_SKIP_POSTGRES=1")
async def test_stream_from_a_replica_while_another_process_runs_the_swarm(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API replica has no engine: the swarm runs in another runtime (a worker), and the
    replica's stream follows it through the shared events table."""
    async with start_facade(db_url, run_engine=False) as replica:
        worker = Runtime(make_settings(db_url), run_engine=True, listen_changes=False)
        async with worker:
            seed = load_seed("kimi_swarm_streaming", replica, monkeypatch)
            sub_results = await seed.streaming_swarm("API 설계 안티패턴을 나열하라.")
            (swarm,) = await latest_swarms(replica, 1)
            assert worker.engine is not None
            async with worker.sessions() as s, s.begin():
                owner = await s.scalar(text("SELECT lease_owner FROM swarms WHERE id = :i"),
                                       {"i": swarm["id"]})
        assert owner == worker.engine.owner
        assert swarm["status"] == "succeeded"
        workers = {s["name"]: s["output"].strip() for s in swarm["subtasks"]
                   if s["kind"] == "worker"}
        assert {r["agent"]: r["result"] for r in sub_results} == workers


async def test_agent_swarm_tools_reach_the_planned_sub_agents(sqlite_url: str,
                                                             tmp_path: Path) -> None:
    """`agent_swarm.tools` is the swarm's `tools` (SPEC §9): the planner hands them to its
    sub-agents, which call them over MCP."""
    server = HttpServer(tmp_path / "mcp.log")
    try:
        config = write_config(tmp_path / "mcp.json", {"docs": {"url": server.url}})
        async with start_facade(sqlite_url, mcp_config=config) as facade:
            completion = await facade.sdk().chat.completions.create(
                model="kimi-k2.5", messages=[{"role": "user", "content": "Look it up"}],
                extra_body={"agent_swarm": {"enabled": True, "tools": ["docs.lookup"],
                                            "fan_in_strategy": "concatenate"}})
            swarm = await facade.swarm(completion.model_extra["swarm_id"])  # type: ignore[index]
    finally:
        server.close()
    assert swarm["status"] == "succeeded", swarm["error"]
    assert swarm["spec"]["tools"] == ["docs.lookup"]
    workers = [s for s in swarm["subtasks"] if s["kind"] == "worker"]
    assert workers and all(s["tool_calls"] == 1 for s in workers)
    assert len(calls(tmp_path / "mcp.log")) == len(workers)
