"""Traces (SPEC §12): the span tree of a swarm with the GenAI attributes, the caller's
traceparent continued, traceparent sent to the gateway, content only when asked for, and a
real OTLP/HTTP receiver that sees one trace across a kill -9 and a takeover."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from app import tracing
from app.gateway.client import GatewayClient
from app.main import create_app
from app.simulator import SimulatorConfig, create_simulator
from tests.conftest import make_settings, start_harness
from tests.helpers import agent, until
from tests.mcp_servers import stdio_server, write_config
from tests.procs import cluster, wait_terminal
from tests.support import free_port

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
GATEWAY_KEY = "sk-live-do-not-leak-0123456789"


class Recording(httpx.AsyncBaseTransport):
    """The simulator, remembering the traceparent of every request it was sent."""

    def __init__(self) -> None:
        self.inner = httpx.ASGITransport(app=create_simulator(SimulatorConfig(latency_ms=0)))
        self.traceparents: list[str | None] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.traceparents.append(request.headers.get("traceparent"))
        return await self.inner.handle_async_request(request)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure([SimpleSpanProcessor(exporter)], env={})
    yield exporter
    tracing.shutdown()


@pytest.fixture
async def traced(sqlite_url: str, spans: InMemorySpanExporter
                 ) -> AsyncIterator[tuple[httpx.AsyncClient, Recording]]:
    gateway_transport = Recording()
    gateway = GatewayClient("http://sim/v1", GATEWAY_KEY, transport=gateway_transport)
    app = create_app(make_settings(sqlite_url), gateway=gateway, run_engine=True)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        yield client, gateway_transport
    await gateway.aclose()


async def run(client: httpx.AsyncClient, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    r = await client.post("/swarms", json=body, headers=headers)
    assert r.status_code == 202, r.text
    r = await client.get(f"/swarms/{r.json()['id']}", params={"wait": 20})
    data: dict[str, Any] = r.json()
    assert data["status"] == "succeeded", data
    return data


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def parent_of(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


def span_id(span: ReadableSpan) -> str:
    return f"{span.context.span_id:016x}"


DAG = {"task": "trace me", "synthesis": {"strategy": "concatenate"},
       "agents": [agent("a"), agent("b", "[[sim fail=500 times=1 retry_after=0]]",
                                    depends_on=["a"])]}


async def test_span_tree_of_a_dag_swarm_with_a_retried_attempt(
        traced: tuple[httpx.AsyncClient, Recording], spans: InMemorySpanExporter) -> None:
    client, gateway = traced
    data = await run(client, DAG, traceparent=CALLER)
    got = spans.get_finished_spans()

    # one trace: the caller's
    assert {f"{s.context.trace_id:032x}" for s in got} == {TRACE_ID}
    [create] = by_name(got, "create_swarm")
    assert parent_of(create) == CALLER_SPAN
    [run_span] = by_name(got, "invoke_agent swarm")
    assert parent_of(run_span) == span_id(create)
    assert run_span.attributes is not None
    assert run_span.attributes["gen_ai.agent.id"] == data["id"]
    [a] = by_name(got, "invoke_agent a")
    [b] = by_name(got, "invoke_agent b")
    for agent_span, name in ((a, "a"), (b, "b")):
        assert parent_of(agent_span) == span_id(run_span)
        assert agent_span.attributes is not None
        assert agent_span.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert agent_span.attributes["gen_ai.agent.name"] == name

    chats = by_name(got, "chat kimi-k2.5")
    under_b = sorted((c for c in chats if parent_of(c) == span_id(b)), key=lambda s: s.start_time
                     or 0)
    assert [parent_of(c) for c in chats].count(span_id(a)) == 1
    assert len(under_b) == 2  # the retry is a sibling attempt
    failed, ok = under_b
    assert failed.attributes is not None and ok.attributes is not None
    assert failed.attributes["error.type"] == "server_error"
    assert failed.status.status_code == StatusCode.ERROR
    assert "error.type" not in ok.attributes
    assert ok.attributes["gen_ai.operation.name"] == "chat"
    assert ok.attributes["gen_ai.provider.name"] == "openai"
    assert ok.attributes["gen_ai.request.model"] == "kimi-k2.5"
    assert ok.attributes["gen_ai.response.model"] == "kimi-k2.5"
    assert ok.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    usage = next(s for s in data["subtasks"] if s["name"] == "b")["usage"]
    assert ok.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert (failed.attributes["gen_ai.usage.input_tokens"]
            + ok.attributes["gen_ai.usage.input_tokens"]) == usage["prompt_tokens"]

    # the gateway was sent each attempt's own span as its parent
    assert sorted(t or "" for t in gateway.traceparents) == sorted(
        f"00-{TRACE_ID}-{span_id(c)}-01" for c in chats)
    # no key, no prompt and no output in any span without the capture switch
    dumped = "".join(s.to_json() for s in got)
    assert GATEWAY_KEY not in dumped and "gen_ai.input.messages" not in dumped
    assert "trace me" not in dumped


async def test_a_swarm_without_traceparent_gets_its_own_trace(
        traced: tuple[httpx.AsyncClient, Recording], spans: InMemorySpanExporter) -> None:
    client, _ = traced
    await run(client, {"task": "t", "agents": [agent("x")],
                       "synthesis": {"strategy": "none"}}, traceparent="not-a-traceparent")
    got = spans.get_finished_spans()
    [create] = by_name(got, "create_swarm")
    assert create.parent is None  # a malformed header is ignored, never refused
    assert len({s.context.trace_id for s in got}) == 1


async def test_the_facade_continues_the_callers_trace(
        traced: tuple[httpx.AsyncClient, Recording], spans: InMemorySpanExporter) -> None:
    client, _ = traced
    r = await client.post("/v1/chat/completions", headers={"traceparent": CALLER}, json={
        "model": "kimi-k2.5", "messages": [{"role": "user", "content": "plan and answer"}],
        "agent_swarm": {"enabled": True, "max_sub_agents": 8}})
    assert r.status_code == 200, r.text
    got = spans.get_finished_spans()
    [create] = by_name(got, "create_swarm")
    assert parent_of(create) == CALLER_SPAN
    assert {f"{s.context.trace_id:032x}" for s in got} == {TRACE_ID}
    assert by_name(got, "invoke_agent @planner")


async def test_message_content_only_with_the_capture_switch(sqlite_url: str) -> None:
    exporter = InMemorySpanExporter()
    tracing.configure([SimpleSpanProcessor(exporter)],
                      env={tracing.CAPTURE_ENV: "true"})
    try:
        sim = create_simulator(SimulatorConfig(latency_ms=0))
        gateway = GatewayClient("http://sim/v1", transport=httpx.ASGITransport(app=sim))
        app = create_app(make_settings(sqlite_url), gateway=gateway, run_engine=True)
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            await run(client, {"task": "capture this task", "agents": [agent("x")],
                               "synthesis": {"strategy": "none"}})
        await gateway.aclose()
    finally:
        tracing.shutdown()
    [chat] = by_name(exporter.get_finished_spans(), "chat kimi-k2.5")
    assert chat.attributes is not None
    assert "capture this task" in str(chat.attributes["gen_ai.input.messages"])
    assert json.loads(str(chat.attributes["gen_ai.output.messages"]))[0]["role"] == "assistant"


async def test_tool_calls_are_execute_tool_spans_under_their_agent(
        sqlite_url: str, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    config = write_config(tmp_path / "mcp.json",
                          {"docs": stdio_server(tmp_path / "docs.log")})
    h, close = await start_harness(make_settings(sqlite_url, mcp_config=config))
    try:
        done = await h.run({"task": "look it up", "synthesis": {"strategy": "none"},
                            "agents": [{"name": "reader", "tools": ["docs.lookup"],
                                        "prompt": "swarm [[sim latency_ms=0]]"}]}, timeout=60)
    finally:
        await close()
    assert done["status"] == "succeeded", done["error"]
    got = spans.get_finished_spans()
    [reader] = by_name(got, "invoke_agent reader")
    [tool] = by_name(got, "execute_tool lookup")
    assert parent_of(tool) == span_id(reader)
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "lookup"
    assert tool.attributes["mcp.server.name"] == "docs"
    # two turns: the call that asked for the tool and the one that answered with its result
    assert len([c for c in by_name(got, "chat kimi-k2.5") if parent_of(c) == span_id(reader)]) == 2


def test_nothing_is_configured_without_the_variables() -> None:
    assert not tracing.wanted({})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "none",
                               "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert not tracing.wanted({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing.configure(env={}) and not tracing.enabled()
    with pytest.raises(ValueError, match="unknown exporter"):
        tracing.configure(env={"OTEL_TRACES_EXPORTER": "zipkin"})


# ---- a real OTLP/HTTP receiver, real processes, a kill -9 --------------------------------


def _read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(120)
async def test_otlp_receiver_sees_one_trace_across_a_takeover(db_url: str,
                                                               tmp_path: Path) -> None:
    port, out = free_port(), tmp_path / "spans.jsonl"
    collector = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] /
        "otlp_collector.py"), str(port), str(out)])
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    try:
        async with cluster(db_url, tmp_path, **otel) as c:
            await c.simulator(latency_ms=20)
            api = await c.api(OTEL_SERVICE_NAME="swarm-api-replica")
            first = await c.worker("worker_a", SWARM_CRASH_AT="before_call:b")
            body = {"task": "traced across a crash", "max_tokens": 50,
                    "synthesis": {"strategy": "none"},
                    "agents": [agent("a"), agent("b", depends_on=["a"])]}
            async with httpx.AsyncClient(timeout=10) as client:
                r = await client.post(f"{api}/swarms", json=body,
                                      headers={"traceparent": CALLER})
            assert r.status_code == 202, r.text
            swarm_id = r.json()["id"]
            assert await first.wait_exit(30) == -signal.SIGKILL  # killed before calling b
            await c.worker("worker_b")
            assert (await wait_terminal(api, swarm_id, timeout=30))["status"] == "succeeded"

            async def b_chat_seen() -> list[dict[str, Any]] | None:
                # worker_b's run span ends last (after its subtasks): wait for both
                spans = _read_spans(out)
                names = {s["name"] for s in spans}
                return spans if {"invoke_agent b", "invoke_agent swarm"} <= names else None

            spans = await until(b_chat_seen, 20, "the spans of worker_b")
    finally:
        collector.send_signal(signal.SIGTERM)
        collector.wait(10)
    assert {s["trace_id"] for s in spans} == {TRACE_ID}
    create = next(s for s in spans if s["name"] == "create_swarm")
    assert create["parent_span_id"] == CALLER_SPAN
    assert create["service"] == "swarm-api-replica"
    runs = [s for s in spans if s["name"] == "invoke_agent swarm"]
    # worker_a's run span died with it; worker_b's continues the stored context
    assert runs and all(r["parent_span_id"] == create["span_id"] for r in runs)
    b_chat = [s for s in spans if s["name"] == "chat kimi-k2.5"
              and s["attributes"].get("gen_ai.usage.output_tokens")]
    assert b_chat, spans
    assert os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") is None  # nothing leaked outward
