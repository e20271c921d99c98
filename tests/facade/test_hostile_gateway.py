"""A passthrough relays what a hostile or broken gateway answers without a 500, a torn stream
or a cut answer that reads as whole; and what a request can be billed is bounded by what it
asks for (choices, both output limits, media), so the daily cap holds in real money."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from app.pricing import BUILTIN_MODELS
from tests.facade.conftest import Facade, start_facade

MODEL = "deepseek-v3.2"
PRICE = BUILTIN_MODELS[MODEL]


def completion(content: Any = "ok", usage: Any = None, n: int = 1) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": i, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"} for i in range(n)],
            "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5}}


def sse(*events: str) -> bytes:
    return b"".join(f"data: {e}\n\n".encode() for e in events)


CHUNK = json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                    "choices": [{"index": 0, "delta": {"content": "Hel"}}]})
# what each `x_mode` (forwarded unchanged in the body) answers: JSON text, or SSE bytes
ANSWERS: dict[str, str | bytes] = {
    "nan": json.dumps(completion()).replace('"created": 1', '"created": NaN'),
    "surrogate": json.dumps(completion("a\ud800b")),
    **{f"deep{d}": json.dumps(completion()).replace('"id": "c1"', '"id": ' + "[" * d + "]" * d)
       for d in (900, 960, 990)},
    "n": json.dumps(completion(n=4, usage={"prompt_tokens": 10, "completion_tokens": 400})),
    "image": json.dumps(completion(usage={"prompt_tokens": 1500, "completion_tokens": 5})),
    "both_limits": json.dumps(completion(usage={"prompt_tokens": 10, "completion_tokens": 300})),
    "stream_surrogate_usage_null": sse(
        json.dumps({"choices": [{"index": 0, "delta": {"content": "a\ud800b"}}],
                    "usage": None}),
        json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
        "[DONE]"),
    "stream_deep": sse(CHUNK, '{"choices":[{"delta":{"content":' + "[" * 100_000
                       + "]" * 100_000 + "}}]}", "[DONE]"),
    "stream_no_done": sse(CHUNK, CHUNK),
}


async def gateway(request: Request) -> Response:
    mode = (await request.json()).get("x_mode")
    answer = ANSWERS[mode]
    if isinstance(answer, bytes):
        return StreamingResponse(iter([answer]), media_type="text/event-stream")
    return Response(answer, media_type="application/json")


@pytest.fixture
async def hostile(sqlite_url: str) -> AsyncIterator[Facade]:
    app = Starlette(routes=[Route("/v1/chat/completions", gateway, methods=["POST"])])
    async with start_facade(sqlite_url, gateway_app=app) as f:
        yield f


def body(mode: str, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
            "x_mode": mode, **kw}


async def billed(f: Facade) -> dict[str, Any]:
    items = {i["key"]: i for i in (await f.usage())["items"]}
    return items[MODEL]


async def test_a_nan_or_lone_surrogate_in_the_answer_is_relayed_as_json(
        hostile: Facade) -> None:
    r = await hostile.http.post("/v1/chat/completions", json=body("nan"))
    assert r.status_code == 200, r.text
    assert r.json()["created"] is None  # JSON has no NaN: the caller's parser may refuse it
    r = await hostile.http.post("/v1/chat/completions", json=body("surrogate"))
    assert r.status_code == 200, r.text
    assert "\\ud800" in r.text and r.json()["choices"][0]["message"]["content"] == "a\ud800b"


@pytest.mark.parametrize("depth", [900, 960, 990])
async def test_an_answer_nested_near_the_parsers_limit_is_never_a_500(
        hostile: Facade, depth: int) -> None:
    """Parsed at a depth the relay may not encode again: relayed, 502 (billed), or, past the
    parser, an unparseable answer retried (503) — never the route's 500."""
    r = await hostile.http.post("/v1/chat/completions", json=body(f"deep{depth}"))
    assert r.status_code in (200, 502, 503), r.text
    assert (await billed(hostile))["gateway_calls"] >= 1


async def test_a_lone_surrogate_in_the_request_is_forwarded_as_its_escape(
        hostile: Facade) -> None:
    raw = json.dumps(body("surrogate", messages=[{"role": "user", "content": "a\ud800b"}]))
    r = await hostile.http.post("/v1/chat/completions", content=raw,
                                headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


async def test_choices_and_the_larger_output_limit_are_billed(hostile: Facade) -> None:
    r = await hostile.http.post("/v1/chat/completions", json=body("n", n=4, max_tokens=100))
    assert r.status_code == 200, r.text
    assert (await billed(hostile))["completion_tokens"] == 400  # 4 x 100 allowed: as reported
    r = await hostile.http.post("/v1/chat/completions", json=body(
        "both_limits", max_tokens=500, max_completion_tokens=10))
    assert r.status_code == 200, r.text
    assert (await billed(hostile))["completion_tokens"] == 700  # a gateway may honour either


@pytest.mark.parametrize("n", [0, 129, "2", True, 1.5])
async def test_a_bad_n_is_a_422(hostile: Facade, n: Any) -> None:
    r = await hostile.http.post("/v1/chat/completions", json=body("n", n=n))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == "n"


async def test_media_is_bounded_by_the_context_window(hostile: Facade) -> None:
    image = {"role": "user", "content": [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}
    r = await hostile.http.post("/v1/chat/completions", json=body("image", messages=[image]))
    assert r.status_code == 200, r.text
    row = await billed(hostile)
    assert row["prompt_tokens"] == 1500  # an image's tokens are not its URL's bytes
    assert Decimal(row["cost_usd"]) == PRICE.cost(1500, 5)


async def read_stream(f: Facade, mode: str) -> list[str]:
    events = []
    async with f.http.stream("POST", "/v1/chat/completions",
                             json=body(mode, stream=True)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():  # a torn body raises here
            if line.startswith("data: "):
                events.append(line[6:])
    return events


async def test_stream_chunks_that_do_not_encode_again_are_relayed(hostile: Facade) -> None:
    events = await read_stream(hostile, "stream_surrogate_usage_null")
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "a\ud800b"
    assert "usage" not in json.loads(events[0]) and events[-1] == "[DONE]"
    events = await read_stream(hostile, "stream_deep")
    assert len(events) == 3 and events[-1] == "[DONE]"


async def test_a_stream_cut_before_done_ends_with_an_error_event(hostile: Facade) -> None:
    events = await read_stream(hostile, "stream_no_done")
    assert len(events) == 3 and "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert "before [DONE]" in error["message"] and error["code"] == "gateway_unavailable"
    row = await billed(hostile)
    assert row["gateway_calls"] == 1 and Decimal(row["cost_usd"]) > 0  # generated: billed


async def test_an_unparseable_body_is_invalid_json(hostile: Facade) -> None:
    for raw in (b'{"model": "\xff"}', b"[" * 100_000 + b"]" * 100_000,
                b'{"n": ' + b"9" * 5000 + b"}"):
        r = await hostile.http.post("/v1/chat/completions", content=raw,
                                    headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_json"
    r = await hostile.http.post("/swarms", content=b'{"task": "\xff"}',
                                headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
