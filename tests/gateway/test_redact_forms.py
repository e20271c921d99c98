"""A gateway that echoes its key transformed — in another case, percent- or `\\u`-escaped, as
HTML entities, base64 (alone or in `Basic` credentials), spaced out, or a middle piece of it —
reaches no sink: not the Redactor's answer, not `subtask.error`, the swarm's error or its events,
not a facade error, not a span."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app import tracing
from app.aio import wait_for
from app.gateway.client import GatewayClient
from app.gateway.redact import Redactor
from tests.conftest import app_on, make_settings

KEY = "gw-3F9a8B7c6D5e4F30a1B2xQ"  # mixed case: a lowercased copy is another string
BASE = "https://llm.corp.example:8443/v1"
MIN_RUN = 12  # any run this long of the key betrays it

FORMS = {
    "lower": KEY.lower(),
    "upper": KEY.upper(),
    "percent": "".join(f"%{b:02X}" for b in KEY.encode()),
    "percent_dash": KEY.replace("-", "%2d"),
    "json_dash": KEY.replace("-", "\\u002d"),
    "json_quoted": KEY.replace("-", "\\\\u002d"),  # a JSON text inside JSON
    "json_all": "".join(f"\\u{ord(c):04x}" for c in KEY),
    "html": "".join(f"&#{ord(c)};" for c in KEY),
    "base64": base64.b64encode(KEY.encode()).decode(),
    "basic": "Basic " + base64.b64encode(f"svc:{KEY}".encode()).decode(),
    "base64url": base64.urlsafe_b64encode(f"k={KEY};".encode()).decode(),
    "spaced": " ".join(KEY),
    "middle": KEY[6:20],
    "middle_lower": KEY[5:18].lower(),
}


def _base64_cores() -> list[str]:
    """The key's base64 text at each alignment, minus the characters the neighbours change."""
    cores = []
    for lead in range(3):
        enc = base64.b64encode(b"\0" * lead + KEY.encode()).decode().rstrip("=")
        cores.append(enc[4:-4])
    return cores


def leaks(text: str) -> list[str]:
    """What of the key `text` still carries: a form as echoed, any MIN_RUN run of the key in
    any case, or the key's base64."""
    low = text.lower()
    found = [name for name, form in FORMS.items() if form in text]
    found += [f"run {i}" for i in range(len(KEY) - MIN_RUN + 1)
              if KEY[i:i + MIN_RUN].lower() in low]
    found += [f"base64 {c}" for c in _base64_cores()
              if c in text or c.replace("+", "-").replace("/", "_") in text]
    return found


def message(form: str) -> str:
    return f"invalid key {FORMS[form]} (ask an admin)"


@pytest.mark.parametrize("form", FORMS)
def test_the_redactor_masks_every_transformed_copy(form: str) -> None:
    clean = Redactor(KEY, BASE)(message(form))
    assert leaks(clean) == [], clean
    assert clean.startswith("invalid key ") and clean.endswith(" (ask an admin)"), clean


@pytest.mark.parametrize("text", [
    "token limit exceeded; max_tokens must be at most 4096",
    "upstream 502 Bad Gateway: %20 spaces and \\u0041 escapes in an ordinary message",
    "base64 of something else: aGVsbG8gd29ybGQsIHRoaXMgaXMgbm90IHRoZSBrZXk=",
])
def test_text_without_the_key_is_unchanged(text: str) -> None:
    assert Redactor(KEY, BASE)(text) == text


FORM_MARK = re.compile(r"FORM=(\w+)")


def _echoing(status: int, together: int = 1) -> httpx.MockTransport:
    """A gateway refusing every call with a message echoing the key in the form its request
    names (`FORM=<name>` in the messages), once `together` calls are in (a 401 stops the
    swarm: the calls not yet sent then never are)."""
    arrived: list[str] = []
    all_in = asyncio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        found = FORM_MARK.search(request.content.decode())
        form = found.group(1) if found else "lower"
        arrived.append(form)
        if len(arrived) >= together:
            all_in.set()
        await wait_for(all_in.wait(), 10)
        return httpx.Response(status, json={"error": {"message": message(form)}})

    return httpx.MockTransport(handle)


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list | tuple):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure([SimpleSpanProcessor(exporter)], env={})
    yield exporter
    tracing.shutdown()


async def test_subtask_errors_events_and_spans_hold_no_transformed_key(
        database_url: str, spans: InMemorySpanExporter) -> None:
    gateway = GatewayClient(BASE, KEY, transport=_echoing(401, together=len(FORMS)))
    agents = [{"name": form, "prompt": f"FORM={form}"} for form in FORMS]
    async with app_on(make_settings(database_url), gateway) as c:
        r = await c.post("/swarms", json={"task": "t", "agents": agents,
                                          "limits": {"failure_tolerance": 1.0,
                                                     "concurrency": len(FORMS)},
                                          "synthesis": {"strategy": "none"}})
        assert r.status_code == 202, r.text
        data: dict[str, Any] = (await c.get(f"/swarms/{r.json()['id']}",
                                            params={"wait": 30})).json()
        events = (await c.get(f"/swarms/{data['id']}/events")).text
    assert data["status"] in ("succeeded", "failed"), data["status"]
    errors = {s["name"]: s["error"]["message"] for s in data["subtasks"] if s["error"]}
    assert set(errors) == set(FORMS)
    for form, text in errors.items():  # each subtask's reason stays readable, its key gone
        assert "invalid key" in text and "ask an admin" in text, (form, text)
        assert leaks(text) == [], (form, text)
    assert leaks(json.dumps(data, ensure_ascii=False)) == []
    frames = [json.loads(line[5:]) for line in events.splitlines() if line.startswith("data:")]
    failed = [f for f in frames if isinstance(f, dict) and f.get("error")]
    assert len(failed) >= len(FORMS)
    assert leaks(json.dumps(frames, ensure_ascii=False)) == [] and leaks(events) == []
    # the spans: each agent's status names its failure, with the key masked
    finished = spans.get_finished_spans()
    described = [s.status.description or "" for s in finished]
    assert sum("invalid key" in d for d in described) >= len(FORMS)
    texts = described + [v for s in finished for v in _strings(dict(s.attributes or {}))]
    texts += [v for s in finished for e in s.events for v in _strings(dict(e.attributes or {}))]
    assert leaks("\n".join(texts)) == []


@pytest.mark.parametrize("form", FORMS)
async def test_a_facade_error_holds_no_transformed_key(sqlite_url: str, form: str) -> None:
    gateway = GatewayClient(BASE, KEY, transport=_echoing(400))
    async with app_on(make_settings(sqlite_url), gateway) as c:
        r = await c.post("/v1/chat/completions", json={
            "model": "kimi-k2.5", "messages": [{"role": "user", "content": f"FORM={form}"}]})
    assert r.status_code == 400, r.text
    text = r.json()["error"]["message"]
    assert "invalid key" in text, text
    assert leaks(r.text) == [], r.text
