"""Hostile input at the edges: every datetime, cursor, header and string a client sends is
answered with a 4xx naming the field (or a complete answer), never a 5xx — on SQLite and on
PostgreSQL, which refuse different things."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.session import make_session_factory
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import assert_rejected, error_of, swarm_count

NUL, LONE = "\x00", "\udfff"


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode("utf-8", "surrogatepass")).decode().rstrip("=")


@pytest.mark.parametrize("raw", [
    "0001-01-01T00:00:00+14:00|4b0e4d68-0b51-4d8e-9b4a-0f3c1c4f7a11",  # no UTC instant
    "9999-12-31T23:59:59-14:00|4b0e4d68-0b51-4d8e-9b4a-0f3c1c4f7a11",  # past year 9999 in UTC
    "0001-01-01T00:00:00+14:00|x",
    "9999-12-31T23:59:59-14:00|x",
    "2026-11-30T12:00:00+00:00|a\x00b",                                # PostgreSQL refuses NUL
    "2026-11-30T12:00:00+00:00|\udfff",
    "2026-11-30T12:00:00|4b0e4d68-0b51-4d8e-9b4a-0f3c1c4f7a11",        # naive
    "2026-11-30T12:00:00+00:00|",
])
async def test_hostile_list_cursor_is_422(harness: Harness, raw: str) -> None:
    r = await harness.client.get("/swarms", params={"cursor": _cursor(raw)})
    assert_rejected(r, 422, "invalid_cursor", "cursor")


async def test_cursor_at_the_edges_of_time_still_pages(harness: Harness) -> None:
    """Extreme but representable cursors are valid: all swarms are before 9999, none before 1."""
    await harness.post({"task": "t", "agents": [{"name": "a"}]})
    late = _cursor("9999-12-31T00:00:00+00:00|ffffffff-ffff-ffff-ffff-ffffffffffff")
    early = _cursor("0001-01-02T00:00:00+00:00|00000000-0000-0000-0000-000000000000")
    assert len((await harness.client.get("/swarms", params={"cursor": late})).json()["items"]) == 1
    assert (await harness.client.get("/swarms", params={"cursor": early})).json()["items"] == []


@pytest.mark.parametrize(("query", "field"), [
    ("from=0001-01-01T00:00:00%2B14:00", "from"),
    ("to=9999-12-31T23:59:59-14:00", "to"),
    ("to=9999-12-31T23:59:59%2D14:00", "to"),
    ("from=0001-01-01T00:00:00 14:00", "from"),  # an unencoded '+'
    ("from=2026-11-30%00", "from"),
])
async def test_usage_window_outside_the_calendar_is_422(harness: Harness, query: str,
                                                        field: str) -> None:
    r = await harness.client.get(f"/usage?{query}")
    assert_rejected(r, 422, "validation_error", field)


async def test_usage_window_at_the_calendar_edges_answers(harness: Harness) -> None:
    r = await harness.client.get("/usage", params={"from": "0001-01-01T14:00:00+14:00",
                                                   "to": "9999-12-31T09:59:59-14:00"})
    assert r.status_code == 200, r.text
    assert r.json()["from"].startswith("0001-01-01T00:00:00")


def _agent(**kw: Any) -> dict[str, Any]:
    return {"task": "t", "agents": [{"name": "a", **kw}]}


# every string a client can put in POST /swarms: (field named in the error, body builder)
STRING_FIELDS: list[tuple[str, Any]] = [
    ("task", lambda s: {"task": f"t{s}"}),
    ("agents.0.name", lambda s: _agent(name=f"a{s}")),
    ("agents.0.system_prompt", lambda s: _agent(system_prompt=f"p{s}")),
    ("agents.0.prompt", lambda s: _agent(prompt=f"p{s}")),
    ("agents.0.model", lambda s: _agent(model=f"kimi-k2.5{s}")),
    ("agents.0.depends_on.0", lambda s: _agent(depends_on=[f"b{s}"])),
    ("model", lambda s: {"task": "t", "model": f"m{s}"}),
    ("orchestrator.model", lambda s: {"task": "t", "orchestrator": {"model": f"m{s}"}}),
    ("synthesis.model", lambda s: {"task": "t", "synthesis": {"model": f"m{s}"}}),
    ("synthesis.strategy", lambda s: {"task": "t", "synthesis": {"strategy": f"vote{s}"}}),
    ("synthesis.compress", lambda s: {"task": "t", "synthesis": {"compress": f"auto{s}"}}),
    ("metadata", lambda s: {"task": "t", "metadata": {f"k{s}": "v"}}),
    ("metadata", lambda s: {"task": "t", "metadata": {"k": f"v{s}"}}),
    ("metadata", lambda s: {"task": "t", "metadata": {"k": [{"deep": f"v{s}"}]}}),
    ("webhook_url", lambda s: {"task": "t", "webhook_url": f"https://hooks.example/{s}"}),
]


@pytest.mark.parametrize("bad", [NUL, LONE], ids=["nul", "lone-surrogate"])
async def test_nul_and_lone_surrogates_in_every_string_field_are_422(
        harness: Harness, bad: str) -> None:
    for field, build in STRING_FIELDS:
        # json.dumps writes a lone surrogate as the escape "\udfff", as a hostile client would
        raw = json.dumps(build(bad))
        r = await harness.client.post("/swarms", content=raw,
                                      headers={"content-type": "application/json"})
        assert r.status_code == 422, (field, r.text)
        assert_rejected(r, 422, None, field)
    assert await swarm_count(harness.client) == 0


async def test_hostile_idempotency_keys_are_422(api: Harness) -> None:
    body = {"task": "t", "agents": [{"name": "a"}]}
    for key in (b"k\x00", b"k\x7f", b"k\x01", b"", b"x" * 256):
        r = await api.client.post("/swarms", json=body, headers={"Idempotency-Key": key})
        assert_rejected(r, 422, "validation_error", "Idempotency-Key")
    # bytes past ASCII arrive as latin-1 text: stored and replayed, not a 500
    first = await api.client.post("/swarms", json=body, headers={"Idempotency-Key": b"k\xff"})
    again = await api.client.post("/swarms", json=body, headers={"Idempotency-Key": b"k\xff"})
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]


# ---- one log line per failure; pool timeouts are 503 ---------------------------------------------


async def test_an_unexpected_error_is_a_500_logged_once(
        api: Harness, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Starlette's last resort re-raised every 500 to the server, which logged it again; the
    ASGI transport would raise it here (raise_app_exceptions) if the app still re-raised it."""
    from app.db import queries

    async def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(queries, "list_swarms", boom)
    with caplog.at_level(logging.INFO):
        r = await api.client.get("/swarms")
    error_of(r, 500, "internal")
    logged = [rec for rec in caplog.records if rec.exc_info or "boom" in rec.getMessage()]
    assert len(logged) == 1, [rec.getMessage() for rec in logged]
    assert "boom" not in r.text


@pytest.mark.postgres
async def test_a_pool_timeout_is_503_unavailable(pg_template: str) -> None:
    h, close = await start_harness(make_settings(pg_template), run_engine=False)
    tiny = create_async_engine(pg_template, pool_size=1, max_overflow=0, pool_timeout=0.2)
    try:
        h.app.state.sessions = make_session_factory(tiny)
        async with tiny.connect():  # holds the only connection
            r = await h.client.get("/swarms")
        err = error_of(r, 503, "unavailable")
        assert r.headers["Retry-After"] == "1" and err["message"]
    finally:
        await tiny.dispose()
        await close()


# ---- the open-bind guard lives in the app ------------------------------------------------------


async def _client_from(h: Harness, ip: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=h.app, client=(ip, 5000)),
                             base_url="http://api")


async def test_open_api_answers_only_loopback_clients(api: Harness) -> None:
    async with await _client_from(api, "203.0.113.7") as remote:
        error_of(await remote.get("/swarms"), 403, "forbidden")
        error_of(await remote.post("/swarms", json={"task": "t"}), 403, "forbidden")
        assert (await remote.get("/healthz")).status_code == 200
    for ip in ("127.0.0.1", "127.8.9.1", "::1"):
        async with await _client_from(api, ip) as local:
            assert (await local.get("/swarms")).status_code == 200, ip
    assert await swarm_count(api.client) == 0


@pytest.mark.parametrize("overrides", [{"api_keys": "t:k"}, {"allow_open": True}])
async def test_keys_or_allow_open_serve_remote_clients(sqlite_url: str,
                                                       overrides: dict[str, Any]) -> None:
    h, close = await start_harness(make_settings(sqlite_url, **overrides), run_engine=False)
    try:
        async with await _client_from(h, "203.0.113.7") as remote:
            r = await remote.get("/swarms", headers={"Authorization": "Bearer k"})
            assert r.status_code == 200, r.text
    finally:
        await close()
