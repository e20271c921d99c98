"""The simulated gateway: answer shape, determinism, directives, faults, plans, auth and stats."""

from __future__ import annotations

import asyncio
import graphlib
import json
import math
import time
from collections.abc import AsyncIterator, MutableMapping
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from app.aio import wait_for
from app.engine.planner import PlanInvalid, parse_plan, planner_messages
from app.simulator import PLAN_HINTS, SimulatorConfig, create_simulator

URL = "/v1/chat/completions"


def _client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim")


@pytest.fixture
def app() -> Starlette:
    return create_simulator(SimulatorConfig(latency_ms=0))


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(app) as c:
        yield c


async def chat(
    client: httpx.AsyncClient,
    content: str = "Summarise the quarterly report",
    *,
    key: str | None = None,
    model: str = "kimi-k2.5",
    **extra: Any,
) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    headers = {"Idempotency-Key": key} if key else {}
    return await client.post(URL, json=body, headers=headers)


def content_of(resp: httpx.Response) -> str:
    text = resp.json()["choices"][0]["message"]["content"]
    assert isinstance(text, str)
    return text


async def plan(client: httpx.AsyncClient, task: str, key: str | None = None, **extra: Any) -> Any:
    messages = [{"role": "system", "content": "You are the orchestrator."},
                {"role": "user", "content": task}]
    body = {"model": "kimi-k2.5", "messages": messages, "max_tokens": 2000,
            "response_format": {"type": "json_object"}, **extra}
    resp = await client.post(URL, json=body, headers={"Idempotency-Key": key} if key else {})
    assert resp.status_code == 200
    return resp.json()


def check_plan(subtasks: list[dict[str, Any]]) -> None:
    """Raise unless the plan is one the engine would accept."""
    ids = [s["id"] for s in subtasks]
    assert subtasks and len(set(ids)) == len(ids)
    assert all(d in ids for s in subtasks for d in s["depends_on"])
    tuple(graphlib.TopologicalSorter({s["id"]: s["depends_on"] for s in subtasks}).static_order())


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
    async with _client(create_simulator(SimulatorConfig(latency_ms=0))) as other:
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
    async with _client(app) as c:
        body = {"model": "kimi-k2.5", "messages": [{"role": "user", "content": "hi"}]}
        missing = await c.post(URL, json=body)
        wrong = await c.post(URL, json=body, headers={"Authorization": "Bearer nope"})
        right = await c.post(URL, json=body, headers={"Authorization": "Bearer sekret"})
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    assert right.status_code == 200


# --- fault directives ----------------------------------------------------------------------------


@pytest.mark.parametrize("code", [400, 401, 403, 404, 408, 409, 422, 429, 500, 502, 503, 504, 529])
async def test_fail_directive_status(client: httpx.AsyncClient, code: int) -> None:
    resp = await chat(client, f"do it [[sim fail={code}]]")
    assert resp.status_code == code
    assert resp.headers["content-type"] == "application/json"
    assert set(resp.json()["error"]) >= {"message", "type"}


@pytest.mark.parametrize("key", ["swarm:worker:1", None])
async def test_times_fails_only_first_attempts(client: httpx.AsyncClient, key: str | None) -> None:
    statuses = [(await chat(client, "x [[sim fail=503 times=2]]", key=key)).status_code
                for _ in range(4)]
    assert statuses == [503, 503, 200, 200]


async def test_times_counts_per_logical_call(client: httpx.AsyncClient) -> None:
    assert (await chat(client, "[[sim fail=500 times=1]]", key="s:a:1")).status_code == 500
    assert (await chat(client, "[[sim fail=500 times=1]]", key="s:b:1")).status_code == 500
    assert (await chat(client, "[[sim fail=500 times=1]]", key="s:a:1")).status_code == 200


async def test_retry_headers() -> None:
    app = create_simulator(SimulatorConfig(latency_ms=0, retry_after_s=3))
    async with _client(app) as c:
        default = await chat(c, "[[sim fail=429]]")
        seconds = await chat(c, "[[sim fail=503 retry_after=7]]")
        millis = await chat(c, "[[sim fail=429 retry_after_ms=250]]")
        dated = await chat(c, "[[sim fail=429 retry_after_date=1]]")
        plain = await chat(c, "[[sim fail=500]]")
    assert default.headers["retry-after"] == "3"
    assert seconds.headers["retry-after"] == "7"
    assert millis.headers["retry-after-ms"] == "250"
    ahead = parsedate_to_datetime(dated.headers["retry-after"]).timestamp() - time.time()
    assert 0 < ahead <= 2
    assert "retry-after" not in plain.headers and "retry-after-ms" not in plain.headers


async def test_html502(client: httpx.AsyncClient) -> None:
    resp = await chat(client, "[[sim fail=html502]]")
    assert resp.status_code == 502
    assert resp.headers["content-type"].startswith("text/html")
    assert resp.text.lstrip().startswith("<html>")


async def test_truncated_body_is_not_json(client: httpx.AsyncClient) -> None:
    resp = await chat(client, "[[sim fail=truncated]]")
    assert resp.status_code == 200 and resp.text.startswith('{"id"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(resp.text)


async def test_timeout_hangs_then_answers(client: httpx.AsyncClient) -> None:
    started = time.monotonic()
    resp = await chat(client, "[[sim fail=timeout hang_s=0.15]]")
    assert resp.status_code == 200 and time.monotonic() - started >= 0.15


async def test_cancelled_hang_leaves_no_in_flight(
    app: Starlette, client: httpx.AsyncClient
) -> None:
    with pytest.raises(TimeoutError):
        await wait_for(chat(client, "[[sim fail=timeout hang_s=30]]"), 0.05)
    assert app.state.stats.in_flight == 0
    assert (await client.get("/v1/_stats")).json()["in_flight"] == 0


async def test_disconnect_ends_a_long_hang(app: Starlette) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content":
                                                    "[[sim fail=timeout hang_s=30]]"}]}).encode()
    incoming: list[MutableMapping[str, Any]] = [
        {"type": "http.request", "body": body, "more_body": False}]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:  # the client is gone right after its body
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": URL, "raw_path": URL.encode(),
             "query_string": b"", "headers": [], "http_version": "1.1", "scheme": "http",
             "server": ("sim", 80), "client": ("test", 1), "root_path": ""}
    await wait_for(app(scope, receive, send), 2)
    assert sent[0]["status"] == 499
    assert app.state.stats.in_flight == 0


async def test_finish_length(client: httpx.AsyncClient) -> None:
    resp = await chat(client, "long essay [[sim finish=length]]", max_tokens=64)
    body = resp.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 64


async def test_answer_and_usage_overrides(client: httpx.AsyncClient) -> None:
    resp = await chat(client, 'q [[sim answer="say \\"yes\\" ]] now" prompt_tokens=11]] '
                              "[[sim completion_tokens=5 cached_tokens=3]]")
    body = resp.json()
    assert content_of(resp) == 'say "yes" ]] now'
    assert body["usage"]["prompt_tokens"] == 11 and body["usage"]["completion_tokens"] == 5
    assert body["usage"]["total_tokens"] == 16
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 3


async def test_later_directive_wins(client: httpx.AsyncClient) -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": "[[sim answer=first]]"},
                                       {"role": "user", "content": "[[sim answer=second]]"}]}
    assert content_of(await client.post(URL, json=body)) == "second"


async def test_stats_say_when_each_calls_last_attempt_arrived(client: httpx.AsyncClient) -> None:
    """Before its latency, not after: what the fan-out's anatomy compares with the caller's
    start (bench_rows --anatomy fanout)."""
    before = time.time()
    assert (await chat(client, "[[sim latency_ms=150]]", key="s:a:1")).status_code == 200
    first = (await client.get("/v1/_stats")).json()["by_key"]["s:a:1"]["received_at"]
    assert before <= first <= before + 0.1
    await chat(client, "again [[sim latency_ms=0]]", key="s:a:1")
    again = (await client.get("/v1/_stats")).json()["by_key"]["s:a:1"]
    assert again["calls"] == 2 and again["received_at"] >= first + 0.15


async def test_latency_directive(client: httpx.AsyncClient) -> None:
    started = time.monotonic()
    await chat(client, "[[sim latency_ms=120]]")
    assert time.monotonic() - started >= 0.12


# --- planning ------------------------------------------------------------------------------------


async def test_default_plan_is_valid(client: httpx.AsyncClient) -> None:
    body = await plan(client, "Review the payment service migration [[sim latency_ms=0]]")
    assert body["choices"][0]["finish_reason"] == "stop"
    subtasks = json.loads(body["choices"][0]["message"]["content"])["subtasks"]
    check_plan(subtasks)
    assert len(subtasks) == 4 and subtasks[0]["id"] == "research_1"
    assert [s["depends_on"] for s in subtasks[:3]] == [[], [], []]
    assert subtasks[3]["depends_on"] == [subtasks[0]["id"], subtasks[1]["id"]]
    assert all(s["model_hint"] in PLAN_HINTS for s in subtasks)
    assert all("payment service migration" in s["description"] for s in subtasks)
    assert not any("[[sim" in s["description"] for s in subtasks)


async def test_plan_size(client: httpx.AsyncClient) -> None:
    body = await plan(client, "Audit the service [[sim plan_size=7]]")
    subtasks = json.loads(body["choices"][0]["message"]["content"])["subtasks"]
    check_plan(subtasks)
    assert len(subtasks) == 7


async def planner_call(client: httpx.AsyncClient, task: str, max_subtasks: int,
                       max_depth: int) -> str:
    """The simulator's answer to the engine's own planning prompt."""
    messages = planner_messages(task, max_subtasks, max_depth, list(PLAN_HINTS))
    body = await plan(client, task, messages=messages)
    content: str = body["choices"][0]["message"]["content"]
    return content


@pytest.mark.parametrize(("max_subtasks", "max_depth"), [(1, 1), (2, 1), (3, 2), (3, 3), (8, 1)])
async def test_plan_keeps_to_the_prompts_bounds(client: httpx.AsyncClient, max_subtasks: int,
                                                max_depth: int) -> None:
    content = await planner_call(client, "Audit the service", max_subtasks, max_depth)
    plan_ = parse_plan(content, "stop", max_subtasks, max_depth)  # what the engine accepts
    assert len(plan_) == min(4, max_subtasks)


async def test_plan_directives_still_shape_a_bounded_plan(client: httpx.AsyncClient) -> None:
    """`plan_size` and the flaws still win over the prompt's bounds, whatever they are."""
    for task, bounds, reason in (("[[sim plan=too_many]]", (2, 2), "too_many"),
                                 ("[[sim plan=too_many]]", (200, 3), "too_many"),
                                 ("[[sim plan_size=3]]", (2, 2), "too_many"),
                                 ("[[sim plan=too_deep]]", (20, 2), "too_deep"),
                                 ("[[sim plan=too_deep]]", (30, 15), "too_deep"),
                                 ("[[sim plan=cyclic]]", (3, 3), "cycle")):
        content = await planner_call(client, task, *bounds)
        with pytest.raises(PlanInvalid) as exc:
            parse_plan(content, "stop", *bounds)
        assert exc.value.reason == reason, (task, bounds)


@pytest.mark.parametrize("kind", ["cyclic", "unknown_dep", "empty", "duplicate"])
async def test_bad_plans_fail_validation(client: httpx.AsyncClient, kind: str) -> None:
    body = await plan(client, f"Audit the service [[sim plan={kind}]]")
    subtasks = json.loads(body["choices"][0]["message"]["content"])["subtasks"]
    with pytest.raises((AssertionError, graphlib.CycleError)):
        check_plan(subtasks)


async def test_plan_too_many_and_too_deep(client: httpx.AsyncClient) -> None:
    many = await plan(client, "[[sim plan=too_many]]")
    deep = await plan(client, "[[sim plan=too_deep]]")
    many_tasks = json.loads(many["choices"][0]["message"]["content"])["subtasks"]
    deep_tasks = json.loads(deep["choices"][0]["message"]["content"])["subtasks"]
    check_plan(many_tasks)
    check_plan(deep_tasks)
    assert len(many_tasks) > 50
    assert len(deep_tasks) > 8 and all(s["depends_on"] for s in deep_tasks[1:])


@pytest.mark.parametrize("kind", ["truncated", "not_json"])
async def test_unparseable_plans(client: httpx.AsyncClient, kind: str) -> None:
    body = await plan(client, f"Audit [[sim plan={kind}]]")
    with pytest.raises(json.JSONDecodeError):
        json.loads(body["choices"][0]["message"]["content"])
    if kind == "truncated":
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 2000


@pytest.mark.parametrize("keys", [("sw1:planner:1", "sw1:planner_repair:1"), (None, None)])
async def test_plan_times_lets_the_repair_succeed(
    client: httpx.AsyncClient, keys: tuple[str | None, str | None]
) -> None:
    first = await plan(client, "Audit [[sim plan=cyclic plan_times=1]]", key=keys[0])
    repair = await plan(client, "Audit [[sim plan=cyclic plan_times=1]] (fix the cycle)",
                        key=keys[1])
    with pytest.raises(graphlib.CycleError):
        check_plan(json.loads(first["choices"][0]["message"]["content"])["subtasks"])
    check_plan(json.loads(repair["choices"][0]["message"]["content"])["subtasks"])


# --- stats ---------------------------------------------------------------------------------------


async def test_stats_track_concurrency_per_swarm() -> None:
    async with _client(create_simulator(SimulatorConfig(latency_ms=80))) as c:
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
    async with _client(app) as c:
        resps = [await chat(c, f"q{i}", key=f"s:a{i}:1") for i in range(10)]
    assert {r.status_code for r in resps} == {429}
    assert all(r.headers["retry-after"] == "2" for r in resps)


async def _statuses(seed: int, rate: float) -> list[int]:
    app = create_simulator(SimulatorConfig(latency_ms=0, rate_500=rate, seed=seed))
    async with _client(app) as c:
        return [(await chat(c, "q", key=f"s:a{i}:1")).status_code for i in range(200)]


async def test_rate_half_is_reproducible_and_retries_can_succeed() -> None:
    first, again, other = await _statuses(0, 0.5), await _statuses(0, 0.5), await _statuses(1, 0.5)
    assert 70 <= first.count(500) <= 130
    assert first == again and first != other
    app = create_simulator(SimulatorConfig(latency_ms=0, rate_500=0.5))
    async with _client(app) as c:
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
    async with _client(create_simulator(config)) as c:
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
