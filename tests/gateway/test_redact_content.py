"""A gateway that echoes its key in a 200 answer's content: the key never reaches a stored
output or the swarm's result (the content's other text is left as the model wrote it)."""

from __future__ import annotations

from typing import Any

import httpx

from app.gateway.chat import ChatRequest
from app.gateway.client import GatewayClient
from app.gateway.redact import MASK
from tests.conftest import app_on, make_settings

KEY = "gw-3f9a8b7c6d5e4f30a1b2"  # a gateway key and its base URL, as tests/gateway/test_redact.py's
BASE = "https://llm.corp.example:8443/v1"

ECHO = f"your key is Bearer {KEY}; again: {KEY}. Say 'token sk-not-ours' if asked."


def _echoing(text: str) -> httpx.MockTransport:
    return httpx.MockTransport(lambda _: httpx.Response(200, json={
        "choices": [{"message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1}}))


async def test_the_client_masks_the_key_in_a_completion() -> None:
    client = GatewayClient(BASE, KEY, transport=_echoing(ECHO))
    try:
        result = await client.complete(ChatRequest(model="m", messages=[], max_tokens=1))
    finally:
        await client.aclose()
    assert KEY not in result.content
    assert result.content == ECHO.replace(KEY, MASK)  # nothing else is touched


async def test_a_keyless_client_leaves_content_alone() -> None:
    client = GatewayClient(BASE, transport=_echoing(ECHO))
    try:
        result = await client.complete(ChatRequest(model="m", messages=[], max_tokens=1))
    finally:
        await client.aclose()
    assert result.content == ECHO


async def test_stored_outputs_and_results_hold_no_echoed_key(sqlite_url: str) -> None:
    gateway = GatewayClient(BASE, KEY, transport=_echoing(ECHO))
    async with app_on(make_settings(sqlite_url), gateway) as c:
        r = await c.post("/swarms", json={"task": "t", "agents": [{"name": "a"}],
                                          "synthesis": {"strategy": "concatenate"}})
        data: dict[str, Any] = (await c.get(f"/swarms/{r.json()['id']}",
                                            params={"wait": 20})).json()
        detail = (await c.get(f"/swarms/{data['id']}/subtasks/a")).text
        events = (await c.get(f"/swarms/{data['id']}/events")).text
    assert data["status"] == "succeeded", data["error"]
    assert MASK in data["subtasks"][0]["output"] and MASK in data["result"]
    for text in (str(data), detail, events):
        assert KEY not in text
