"""The typed client (swarm_api_client) against a real `swarm-api serve` on PostgreSQL: every
method, typed errors, `create` retried after a lost answer (503) without a second swarm,
`Retry-After` honoured on 429, and `events` resuming after the connection drops mid-stream."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from email.utils import formatdate
from typing import Any

import httpx
import pytest

from swarm_api_client import (
    AsyncSwarmClient,
    Conflict,
    ConnectionFailed,
    InvalidRequest,
    NotFound,
    RateLimited,
    RetryPolicy,
    SubtaskDetail,
    SwarmClient,
    SwarmCreate,
    SwarmEvent,
    SwarmRead,
    ToolList,
    Unauthorized,
    Unavailable,
    UsageReport,
    WaitTimeout,
)
from tests.client_support import API_KEY, SERVICE_ENV, CuttingProxy, five_agents
from tests.mcp_servers import HttpServer, write_config
from tests.procs import live_service

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
FAST = RetryPolicy(max_retries=3, backoff_s=0.05, max_backoff_s=0.2)


@pytest.fixture(scope="module")
def api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("client")
    mcp = HttpServer(workdir / "mcp.log")  # one real MCP server (streamable HTTP) for GET /tools
    try:
        config = write_config(workdir / "mcp.json", {"docs": {"url": mcp.url}})
        with live_service(workdir, SWARM_MCP_CONFIG=config, **SERVICE_ENV) as url:
            yield url
    finally:
        mcp.close()


@pytest.fixture
def client(api_url: str) -> Iterator[SwarmClient]:
    with SwarmClient(api_url, api_key=API_KEY, retry=FAST) as c:
        yield c


class Spy(httpx.BaseTransport):
    """Forwards to the real service and keeps every request."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.inner.handle_request(request)


def test_create_wait_get_and_list_every_page(api_url: str) -> None:
    spy = Spy()
    with SwarmClient(api_url, api_key=API_KEY, retry=FAST, transport=spy) as client:
        first = client.create(five_agents("first of two"))
        assert isinstance(first, SwarmRead) and first.progress.total == 6
        done = client.wait(first.id, timeout=60)
        assert done.status == "succeeded" and done.result
        assert [s.status for s in done.subtasks] == ["succeeded"] * 6
        assert client.get(first.id) == done
        one = client.subtask(first.id, "agent_1")
        assert isinstance(one, SubtaskDetail) and one.output == done.subtasks[0].output
        assert (one.tools, one.transcript, one.turns) == ([], [], 0)  # no tools: one call
        with pytest.raises(NotFound):
            client.subtask(first.id, "no/such agent")
        second = client.wait(client.create(five_agents("second of two")).id, timeout=60)

        spy.requests.clear()
        ids = [s.id for s in client.list(page_size=1)]  # one swarm per page
        assert ids.index(second.id) < ids.index(first.id), "newest first"
        assert len(ids) == len(set(ids))
        pages = [r for r in spy.requests if r.url.path == "/swarms"]
        assert len(pages) >= len(ids) and all(r.url.params["limit"] == "1" for r in pages)
        assert second.id in {s.id for s in client.list(status="succeeded")}

        spy.requests.clear()  # `limit` caps the swarms yielded (and the pages' sizes)
        assert [s.id for s in client.list(limit=1)] == ids[:1]
        assert [s.id for s in client.list(limit=2, page_size=1)] == ids[:2]
        assert [r.url.params["limit"] for r in spy.requests] == ["1", "1", "1"]
        assert list(client.list(limit=0)) == []
        assert not [s for s in client.list(status="running") if s.id in (first.id, second.id)]


def test_wait_times_out_then_cancel(client: SwarmClient) -> None:
    swarm = client.create(five_agents("slow", "[[sim latency_ms=20000]]"))
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        client.wait(swarm.id, timeout=0.5)
    assert info.value.code == "wait_timeout" and time.monotonic() - t0 < 5
    client.cancel(swarm.id)
    final = client.wait(swarm.id, timeout=30)
    assert final.status == "cancelled"
    with pytest.raises(Conflict) as again:
        client.cancel(swarm.id)
    assert (again.value.code, again.value.status_code) == ("already_terminal", 409)


def test_errors_are_typed_with_the_spec_code(api_url: str, client: SwarmClient) -> None:
    with pytest.raises(NotFound) as missing:
        client.get(str(uuid.uuid4()))
    assert (missing.value.code, missing.value.status_code) == ("not_found", 404)
    with pytest.raises(InvalidRequest) as bad_model:
        client.create({"task": "x", "model": "no-such-model"})
    assert bad_model.value.code == "unknown_model"
    assert bad_model.value.details["field"] == "model"

    key = f"k-{uuid.uuid4()}"
    one = client.create(five_agents("keyed"), idempotency_key=key)
    assert client.create(five_agents("keyed"), idempotency_key=key).id == one.id
    with pytest.raises(InvalidRequest) as reused:
        client.create(five_agents("another body"), idempotency_key=key)
    assert reused.value.code == "idempotency_key_reused"

    with SwarmClient(api_url, api_key="wrong", retry=FAST) as stranger:
        with pytest.raises(Unauthorized) as refused:
            stranger.get(one.id)
    assert (refused.value.code, refused.value.status_code) == ("unauthorized", 401)


def test_usage_reconciles_with_the_swarms(client: SwarmClient) -> None:
    client.wait(client.create(five_agents("for usage")).id, timeout=60)
    report = client.usage(group_by="model")
    assert isinstance(report, UsageReport) and report.group_by == "model"
    assert Decimal(report.total.cost_usd) == sum(
        (Decimal(s.usage.cost_usd) for s in client.list()), Decimal(0))
    assert sum(i.gateway_calls for i in report.items) == report.total.gateway_calls > 0
    today = client.usage(group_by="day", start=time.strftime("%Y-%m-%d", time.gmtime()))
    assert today.total == report.total


class LoseFirstAnswer(httpx.BaseTransport):
    """The service receives the first POST /swarms and creates the swarm, but the client is
    answered 503 + Retry-After: 1 instead (an answer lost in a proxy)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.posts: list[httpx.Request] = []
        self.lost: list[dict[str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST" and request.url.path == "/swarms":
            self.posts.append(request)
            if len(self.posts) == 1:
                response.read()
                assert response.status_code == 202, response.text
                self.lost.append(json.loads(response.content))
                return httpx.Response(503, headers={"Retry-After": "1"}, json={
                    "error": {"code": "unavailable", "message": "retry", "details": None}})
        return response


def test_create_retried_after_503_makes_one_swarm(api_url: str) -> None:
    transport = LoseFirstAnswer()
    task = f"once only {uuid.uuid4()}"
    with SwarmClient(api_url, api_key=API_KEY, retry=FAST, transport=transport) as client:
        t0 = time.monotonic()
        swarm = client.create(five_agents(task))
        elapsed = time.monotonic() - t0
        assert swarm.id == transport.lost[0]["id"], "the retry replays the swarm first created"
        assert elapsed >= 1.0, "Retry-After: 1 honoured (the backoff alone is < 0.2 s)"
        keys = [r.headers["Idempotency-Key"] for r in transport.posts]
        assert len(keys) == 2 and keys[0] == keys[1] and keys[0]
        assert [s.id for s in client.list() if s.task == task] == [swarm.id]


def _mock_client(handler: Any, **kw: Any) -> SwarmClient:
    return SwarmClient("http://swarm.test", api_key=API_KEY,
                       transport=httpx.MockTransport(handler), **kw)


def _limited(retry_after: str) -> httpx.Response:
    return httpx.Response(429, headers={"Retry-After": retry_after}, json={"error": {
        "code": "rate_limited", "message": "slow down", "details": {"limit": "burst"}}})


@pytest.mark.parametrize("header", ["1", "date"])
def test_429_waits_for_retry_after(client: SwarmClient, header: str) -> None:
    swarm = client.create(five_agents("served by a mock"))
    seen: list[tuple[float, httpx.Request]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((time.monotonic(), request))
        if len(seen) == 1:  # an HTTP date 2 s ahead: at least 1 s once rounded to seconds
            return _limited("1" if header == "1" else formatdate(time.time() + 2, usegmt=True))
        return httpx.Response(202, json=swarm.model_dump(mode="json"))

    with _mock_client(handler, retry=FAST) as mocked:
        assert mocked.create(five_agents("served by a mock")) == swarm
    assert len(seen) == 2 and seen[1][0] - seen[0][0] >= 1.0
    assert seen[0][1].headers["Idempotency-Key"] == seen[1][1].headers["Idempotency-Key"]
    assert seen[0][1].headers["Authorization"] == f"Bearer {API_KEY}"


def test_429_gives_up_typed_and_connection_errors_become_connection_failed() -> None:
    calls: list[httpx.Request] = []

    def limited(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return _limited("0")

    with _mock_client(limited, retry=RetryPolicy(max_retries=2)) as c, \
            pytest.raises(RateLimited) as info:
        c.tools()
    assert len(calls) == 3 and info.value.code == "rate_limited"
    assert info.value.retry_after == 0 and info.value.details == {"limit": "burst"}

    def refused(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("connection refused", request=request)

    calls.clear()
    with _mock_client(refused, retry=FAST) as c, pytest.raises(ConnectionFailed) as down:
        c.get("anything")
    assert len(calls) == 4 and down.value.code == "connection_error"
    assert "http://swarm.test" in str(down.value)


def test_server_errors_retried_only_when_transient() -> None:
    answers = [httpx.Response(502, text="<html><body>bad gateway</body></html>"),
               httpx.Response(200, json={"items": []}),
               httpx.Response(500, json={"error": {"code": "internal", "message": "bug",
                                                   "details": None}})]
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return answers[len(calls) - 1]

    with _mock_client(handler, retry=FAST) as c:
        assert c.tools().items == []  # a proxy's HTML 502, then the answer
        with pytest.raises(Unavailable) as info:
            c.tools()  # a 500 is a bug, not a hiccup: raised at once
    assert len(calls) == 3
    assert (info.value.code, info.value.status_code, info.value.message) == ("internal", 500, "bug")


def test_events_reconnect_when_a_stream_ends_early_on_a_running_swarm() -> None:
    """A server shutting down ends the stream cleanly: the client reads the swarm, sees it
    running, and reconnects (from the last event it saw) until `swarm.completed`."""
    streams: list[httpx.Request] = []
    body = _swarm_json("x")

    def sse(*events: tuple[int, str]) -> httpx.Response:
        text = "".join(f'id: {i}\nevent: {name}\ndata: {{"seq": {i}}}\n\n' for i, name in events)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=text)

    def handler(request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/events"):
            return httpx.Response(200, json={**body, "status": "running"})
        streams.append(request)
        return [sse((1, "swarm.status")), sse(), sse((2, "swarm.completed"))][len(streams) - 1]

    with _mock_client(handler, retry=FAST) as c:
        events = list(c.events("s"))
    assert [(e.id, e.event) for e in events] == [(1, "swarm.status"), (2, "swarm.completed")]
    assert [r.headers.get("Last-Event-ID") for r in streams] == [None, "1", "1"]


def _events_sync(url: str, swarm_id: str) -> list[SwarmEvent]:
    with SwarmClient(url, api_key=API_KEY, retry=FAST) as c:
        return list(c.events(swarm_id))


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_events_resume_after_the_connection_drops(api_url: str, flavour: str) -> None:
    async with CuttingProxy(api_url, after=3) as proxy, \
            AsyncSwarmClient(proxy.url, api_key=API_KEY, retry=FAST) as via_proxy:
        swarm = await via_proxy.create(five_agents("streamed", "[[sim latency_ms=150]]"))
        if flavour == "async":
            events = [e async for e in via_proxy.events(swarm.id)]
        else:
            events = await asyncio.to_thread(_events_sync, proxy.url, swarm.id)
    assert proxy.cut == 1, "the first stream was cut after its third event"
    assert b"last-event-id: 3\r\n" in bytes(proxy.requests).lower()
    assert [e.id for e in events] == list(range(1, len(events) + 1)), "each event once, in order"
    assert events[-1].event == "swarm.completed" and events[-1].data["status"] == "succeeded"
    async with AsyncSwarmClient(api_url, api_key=API_KEY) as direct:
        assert [e async for e in direct.events(swarm.id)] == events
        tail = [e async for e in direct.events(swarm.id, last_event_id=len(events) - 2)]
        assert tail == events[-2:]
        assert [e async for e in direct.events(swarm.id, last_event_id=len(events))] == []


async def test_async_client_methods(api_url: str) -> None:
    async with AsyncSwarmClient(api_url, api_key=API_KEY, retry=FAST) as client:
        swarm = await client.create(SwarmCreate.model_validate(five_agents("async")))
        done = await client.wait(swarm.id, timeout=60)
        assert done.status == "succeeded" and await client.get(swarm.id) == done
        assert swarm.id in [s.id async for s in client.list(page_size=2)]
        assert [s.id async for s in client.list(limit=1)] == [swarm.id]
        report = await client.usage()
        assert Decimal(report.total.cost_usd) >= Decimal(done.usage.cost_usd) > 0
        slow = await client.create(five_agents("async slow", "[[sim latency_ms=20000]]"))
        assert (await client.cancel(slow.id)).id == slow.id
        assert (await client.wait(slow.id, timeout=30)).status == "cancelled"
        with pytest.raises(NotFound):
            await client.get(str(uuid.uuid4()))


def test_retry_reuses_what_succeeded(client: SwarmClient) -> None:
    body = five_agents("retried")
    # agent_3 is refused every time, once the others have had time to finish
    body["agents"][2]["system_prompt"] += " [[sim fail=400 latency_ms=1500]]"
    failed = client.wait(client.create(body).id, timeout=60)
    assert failed.status == "failed"
    with pytest.raises(Conflict) as running:
        client.retry(client.create(five_agents("busy", "[[sim latency_ms=20000]]")).id)
    assert running.value.code == "not_retryable"

    key = f"retry-{uuid.uuid4()}"
    again = client.retry(failed.id, limits={"failure_tolerance": 0.5}, idempotency_key=key)
    assert again.retry_of == failed.id and again.id != failed.id
    assert client.retry(failed.id, limits={"failure_tolerance": 0.5},
                        idempotency_key=key).id == again.id, "the same key: the same retry"
    done = client.wait(again.id, timeout=60)
    assert done.status == "succeeded", done.error
    reused = {s.name for s in done.subtasks if s.reused}
    assert reused == {s.name for s in failed.subtasks if s.status == "succeeded"}
    assert reused and "agent_3" not in reused
    assert client.get(failed.id).status == "failed", "the old swarm is not changed"
    with pytest.raises(Conflict) as succeeded:
        client.retry(done.id)
    assert (succeeded.value.code, succeeded.value.status_code) == ("not_retryable", 409)


async def test_tools_lists_what_the_mcp_servers_offer(api_url: str) -> None:
    with SwarmClient(api_url, api_key=API_KEY, retry=FAST) as client:
        tools = client.tools()
    assert isinstance(tools, ToolList)
    assert [(t.server, t.name) for t in tools.items] == [
        ("docs", "fail"), ("docs", "lookup"), ("docs", "read_file"), ("docs", "sleep")]
    lookup = next(t for t in tools.items if t.name == "lookup")
    assert lookup.input_schema["required"] == ["query"] and lookup.description
    async with AsyncSwarmClient(api_url, api_key=API_KEY, retry=FAST) as aclient:
        assert await aclient.tools() == tools


def _swarm_json(retry_of: str) -> dict[str, Any]:
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": "0"}
    return {"id": str(uuid.uuid4()), "status": "queued", "created_at": "2026-11-30T12:00:00Z",
            "started_at": None, "finished_at": None, "task": "t", "metadata": {}, "spec": {},
            "progress": {"total": 0}, "subtasks": [], "usage": {**zero, "gateway_calls": 0},
            "timing": {"wall_s": None, "critical_path_s": 0, "serial_s": 0, "speedup": None,
                       "subtask_latency_s": {"p50": None, "p95": None, "p99": None}},
            "queue_position": 1, "result": None, "error": None, "retry_of": retry_of}
