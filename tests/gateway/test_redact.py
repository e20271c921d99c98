"""The gateway's key (whole, partly masked, labelled) and host never reach a stored or returned
error: by pattern, not only when echoed exactly."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from app.gateway.chat import ChatRequest
from app.gateway.client import GatewayClient
from app.gateway.errors import GatewayRejected
from app.gateway.redact import Redactor
from tests.conftest import app_on, make_settings

KEY = "gw-3f9a8b7c6d5e4f30a1b2"
BASE = "https://llm.corp.example:8443/v1"
SECRETS = (KEY, "3f9a8b7c", "a1b2", "llm.corp.example", "8443")

LEAKS = [
    f"Incorrect API key provided: {KEY[:7]}{'*' * 12}{KEY[-4:]}",
    f"key {KEY[:8]}...{KEY[-4:]} is revoked",
    f"Authorization: Bearer {KEY}",
    f"bad header x-api-key={KEY[:-1]}",
    f'{{"error": {{"api_key": "{KEY[3:]}"}}}}',
    f"token {KEY[4:16]} expired",
    "upstream llm.corp.example:8443 refused; retry LLM.CORP.EXAMPLE later",
    "your key sk-proj-Ab12Cd34Ef56 is not this gateway's",
]


@pytest.mark.parametrize("text", LEAKS)
def test_every_shape_of_the_key_and_the_host_is_hidden(text: str) -> None:
    clean = Redactor(KEY, BASE)(text)
    for secret in SECRETS:
        assert secret.lower() not in clean.lower(), (text, clean)


@pytest.mark.parametrize("text", [
    "token limit exceeded; max_tokens must be at most 4096",
    "model 'kimi-k2.5' is overloaded, retry later...",
    "HTTP 503: upstream timeout after 30 s",
])
def test_ordinary_errors_stay_readable(text: str) -> None:
    assert Redactor(KEY, BASE)(text) == text


def _errors(node: Any, inside: bool = False) -> list[str]:
    """Every string under an `error` key: where a leak would be. Ids and timestamps are left out,
    where a secret's digits ("8443", "a1b2") turn up by chance."""
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _errors(v, inside or k == "error")]
    if isinstance(node, list):
        return [s for v in node for s in _errors(v, inside)]
    return [node] if inside and isinstance(node, str) else []


def _gateway(text: str) -> httpx.MockTransport:
    return httpx.MockTransport(lambda _: httpx.Response(401, json={"error": {"message": text}}))


async def test_the_client_raises_redacted_errors() -> None:
    for leak in LEAKS:
        client = GatewayClient(BASE, KEY, transport=_gateway(leak))
        try:
            with pytest.raises(GatewayRejected) as caught:
                await client.complete(ChatRequest(model="m", messages=[], max_tokens=1))
        finally:
            await client.aclose()
        records = [r.error or "" for r in caught.value.attempts]
        for secret in SECRETS:
            assert secret not in str(caught.value), (leak, str(caught.value))
            assert not any(secret in e for e in records), (leak, records)


async def test_stored_subtask_and_swarm_errors_are_redacted(sqlite_url: str) -> None:
    leak = " | ".join(LEAKS)
    gateway = GatewayClient(BASE, KEY, transport=_gateway(leak))
    async with app_on(make_settings(sqlite_url), gateway) as c:
        r = await c.post("/swarms", json={"task": "t", "agents": [{"name": "a"}]})
        data: dict[str, Any] = (await c.get(f"/swarms/{r.json()['id']}",
                                            params={"wait": 20})).json()
        events = (await c.get(f"/swarms/{data['id']}/events")).text
    assert data["status"] == "failed" and data["error"]["code"] == "gateway_rejected"
    assert "revoked" in data["subtasks"][0]["error"]["message"]  # the reason stays readable
    frames = [json.loads(line[5:]) for line in events.splitlines() if line.startswith("data:")]
    texts = _errors(data) + _errors(frames)
    assert sum("revoked" in t for t in texts) >= 3  # the swarm's, the subtask's, an event's
    for secret in SECRETS:
        assert not any(secret in t for t in texts), secret
    for secret in SECRETS[:3]:  # long enough never to turn up in an id or a time by chance
        assert secret not in str(data) and secret not in events, secret
