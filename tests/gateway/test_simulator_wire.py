"""The simulator's cheap chat path answers as the routed one did: the same bytes, the same
routes for anything else, latency counted from the request's arrival (decision 0029)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.aio import wait_for
from app.simulator import SimulatorConfig, create_simulator
from app.simulator.app import _wait
from app.simulator.directives import Directives, parse_request
from app.simulator.responses import chat_completion, completion_body, dumps

URL = "/v1/chat/completions"


def _completion(content: str = "hello", *, model: str = "kimi-k2.5", length: bool = False,
                **directives: Any) -> dict[str, Any]:
    raw = json.dumps({"model": model, "max_tokens": 50,
                      "messages": [{"role": "user", "content": content}]}).encode()
    return chat_completion(parse_request(raw), Directives(**directives), "s:a:1", 1, length,
                           lambda: None)


@pytest.mark.parametrize("completion", [
    _completion(), _completion("Héllo wörld ✓ \"quoted\" \\ back\nslash", model="gpt-4.1"),
    _completion(answer='say "yes" ]] \u2028 \x01 now'), _completion(length=True),
    _completion(poison=1), _completion(prompt_tokens=11, completion_tokens=5, cached_tokens=3),
    _completion(answer=""),
])
def test_completion_body_is_dumps_byte_for_byte(completion: dict[str, Any]) -> None:
    assert completion_body(completion) == dumps(completion)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_content_is_spelled_as_dumps_spells_it(text: str) -> None:
    completion = _completion(answer=text)
    assert completion_body(completion) == dumps(completion)
    assert json.loads(completion_body(completion))["choices"][0]["message"]["content"] == text


def test_tool_calls_use_the_general_encoder() -> None:
    completion = _completion()
    completion["choices"][0]["message"] = {"role": "assistant", "content": None,
                                           "tool_calls": [{"id": "c1", "type": "function"}]}
    assert completion_body(completion) == dumps(completion)


async def test_the_direct_path_answers_as_the_routed_one() -> None:
    """A root_path sends the call through Starlette's routing: the answer is the same."""
    app = create_simulator(SimulatorConfig(latency_ms=0))
    body = {"model": "kimi-k2.5", "messages": [{"role": "user", "content": "what is a swarm?"}]}
    answers = []
    for root in ("", "/gw"):
        transport = httpx.ASGITransport(app=app, root_path=root)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as c:
            answers.append(await c.post(f"{root}{URL}", json=body))
    direct, routed = answers
    assert direct.status_code == routed.status_code == 200
    assert direct.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert direct.headers["content-length"] == routed.headers["content-length"]
    assert direct.json()["choices"] == routed.json()["choices"]
    assert app.state.stats.calls == 2 and app.state.stats.ok == 2


async def test_other_methods_and_routes_are_served_as_before() -> None:
    app = create_simulator(SimulatorConfig(latency_ms=0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://sim") as c:
        assert (await c.get(URL)).status_code == 405
        assert (await c.get("/v1/nowhere")).status_code == 404
        assert (await c.get("/v1/_stats")).json()["calls"] == 0


async def test_the_latency_runs_from_the_arrival() -> None:
    """Time the simulator spent before its wait is inside the latency asked for."""
    async def receive() -> dict[str, Any]:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    loop = asyncio.get_running_loop()
    for seconds in (0.3, 1.3):  # a short wait, and a long one that watches for a disconnect
        started = loop.time()
        assert await _wait(receive, seconds, started - (seconds - 0.05))
        assert loop.time() - started < 0.25


async def test_a_call_is_out_of_flight_while_its_stream_is_sent() -> None:
    """As when Starlette sent the response after the handler returned: a paced stream's
    sending is not counted in flight."""
    app = create_simulator(SimulatorConfig(latency_ms=0))
    body = json.dumps({"model": "m", "stream": True, "messages": [
        {"role": "user", "content": "[[sim stream_ms=100]]"}]}).encode()
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    seen: list[int] = []

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            seen.append(app.state.stats.in_flight)

    scope = {"type": "http", "method": "POST", "path": URL, "raw_path": URL.encode(),
             "query_string": b"", "headers": [(b"idempotency-key", b"s:a:1")],
             "http_version": "1.1", "scheme": "http", "server": ("sim", 80),
             "client": ("test", 1), "root_path": ""}
    await wait_for(app(scope, receive, send), 5)
    assert len(seen) > 2 and set(seen) == {0}
    assert app.state.stats.ok == 1 and app.state.stats.swarm_in_flight == {}
