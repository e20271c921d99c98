"""The simulator's directives: faults (statuses, retry headers, HTML and truncated bodies, hangs
and disconnects, counted per logical call), length finishes, answer and usage overrides,
latency, and the stats of when each call's last attempt arrived."""

from __future__ import annotations

import json
import time
from collections.abc import MutableMapping
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from app.aio import wait_for
from app.simulator import SimulatorConfig, create_simulator
from tests.simulator_support import URL, chat, content_of, sim_client


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
    async with sim_client(app) as c:
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
