"""API keys: every swarm route needs one (401), a tenant sees only its own swarms and
Idempotency-Keys, the ops routes need none (SPEC §3); a key stored as its SHA-256 only, scopes
per route family (403 `insufficient_scope`), expiry (401), two keys of one tenant valid at
once while a rotation runs, the tenants file's keys read again on SIGHUP or when it changes,
and the key's id (never the key) in the request's log lines."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

from app import logs, tracing
from app.api import deps
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import BODY, SLOW, agent, error_of

READ_KEY, WRITE_KEY, OLD_KEY, NEW_KEY = "rk-read-1", "wk-write-1", "old-key-1", "new-key-1"
SWARM = {"task": "t", "agents": [agent("a")]}
CHAT = {"model": "kimi-k2.5", "messages": [{"role": "user", "content": "hi"}]}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def write_tenants(path: Path, body: str) -> None:
    path.write_text(body)
    # a rewrite within the file system's mtime granularity still reads as a change
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


TENANTS = f"""
[tenants.acme]
keys = [
  {{ sha256 = "{sha(READ_KEY)}", scopes = ["swarms:read"], id = "dash" }},
  {{ key = "{WRITE_KEY}", scopes = ["swarms:write", "chat"], id = "ci" }},
  {{ sha256 = "{sha(OLD_KEY)}", expires_at = "2030-01-31T00:00:00Z", id = "old" }},
  {{ sha256 = "{sha(NEW_KEY)}", id = "new" }},
]
"""


@pytest.fixture
async def scoped(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    tenants = tmp_path / "tenants.toml"
    write_tenants(tenants, TENANTS)
    h, close = await start_harness(make_settings(database_url, tenants_file=str(tenants)))
    yield h
    await close()


async def test_a_key_given_as_its_hash_is_accepted_without_its_text(database_url: str) -> None:
    settings = make_settings(database_url, api_keys=f"acme:sha256:{sha('s3cret-key')}")
    assert "s3cret-key" not in repr(settings.keys.keys)  # only the digest is kept
    h, close = await start_harness(settings)
    try:
        r = await h.post(SWARM, headers=bearer("s3cret-key"))
        assert r.status_code == 202, r.text
        error_of(await h.client.get("/swarms", headers=bearer(sha("s3cret-key"))), 401)
        listed = (await h.client.get("/swarms", headers=bearer("s3cret-key"))).json()
        assert [s["id"] for s in listed["items"]] == [r.json()["id"]]
    finally:
        await close()


async def test_each_route_family_needs_its_scope(scoped: Harness) -> None:
    h = scoped
    sid = (await h.post(SWARM, headers=bearer(WRITE_KEY))).json()["id"]
    read, write = bearer(READ_KEY), bearer(WRITE_KEY)
    # swarms:read: every GET of a swarm, its events, the tools
    for path in ("/swarms", f"/swarms/{sid}", f"/swarms/{sid}/subtasks/a", "/tools"):
        assert (await h.client.get(path, headers=read)).status_code in (200, 404), path
    for path in ("/swarms", f"/swarms/{sid}", f"/swarms/{sid}/subtasks/a", "/tools",
                 f"/swarms/{sid}/events"):
        err = error_of(await h.client.get(path, headers=write), 403, "insufficient_scope")
        assert err["details"] == {"scope": "swarms:read", "key_id": "ci"}
    # swarms:write: create, cancel, retry (a read key is refused before its body is read)
    for path, body in (("/swarms", SWARM), (f"/swarms/{sid}/cancel", None),
                       (f"/swarms/{sid}/retry", None), ("/swarms", {"not": "a swarm"})):
        err = error_of(await h.client.post(path, json=body, headers=read), 403,
                       "insufficient_scope")
        assert err["details"] == {"scope": "swarms:write", "key_id": "dash"}
    # usage:read and audit:read: neither key has them
    for path, scope in (("/usage", "usage:read"), ("/audit", "audit:read")):
        for headers in (read, write):
            err = error_of(await h.client.get(path, headers=headers), 403, "insufficient_scope")
            assert err["details"]["scope"] == scope
    # chat: the facade, in OpenAI's error shape
    r = await h.client.post("/v1/chat/completions", json=CHAT, headers=read)
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "insufficient_scope"
    assert r.json()["error"]["type"] == "permission_error"
    assert (await h.client.get("/v1/models", headers=write)).status_code == 200
    # a key without scopes listed has every one
    for path in ("/usage", "/audit", "/swarms", "/v1/models"):
        assert (await h.client.get(path, headers=bearer(NEW_KEY))).status_code == 200, path


async def test_rotation_keeps_the_old_key_until_its_expiry(
        scoped: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    h = scoped
    before = datetime(2030, 1, 30, 23, 59, tzinfo=UTC)
    monkeypatch.setattr(deps, "now_utc", lambda: before)
    for key in (OLD_KEY, NEW_KEY):  # both valid at once: no downtime while clients move
        assert (await h.client.get("/swarms", headers=bearer(key))).status_code == 200
    monkeypatch.setattr(deps, "now_utc", lambda: before + timedelta(minutes=1))
    err = error_of(await h.client.get("/swarms", headers=bearer(OLD_KEY)), 401, "unauthorized")
    assert err["message"] == "API key expired" and err["details"] == {"key_id": "old"}
    error_of(await h.post(SWARM, headers=bearer(OLD_KEY)), 401)
    assert (await h.client.get("/swarms", headers=bearer(NEW_KEY))).status_code == 200


async def test_the_tenants_file_is_read_again_when_it_changes(database_url: str,
                                                              tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    write_tenants(tenants, f'[tenants.acme]\nkeys = [{{ sha256 = "{sha(OLD_KEY)}" }}]\n')
    h, close = await start_harness(make_settings(database_url, tenants_file=str(tenants)))
    try:
        ring = h.app.state.settings.keys
        ring.check_every_s = 0.0  # every request looks at the mtime
        error_of(await h.client.get("/swarms", headers=bearer(NEW_KEY)), 401)
        write_tenants(tenants, f'[tenants.acme]\nkeys = [{{ sha256 = "{sha(NEW_KEY)}" }}]\n')
        assert (await h.client.get("/swarms", headers=bearer(NEW_KEY))).status_code == 200
        error_of(await h.client.get("/swarms", headers=bearer(OLD_KEY)), 401)
        # a file that no longer validates keeps the keys in force
        write_tenants(tenants, '[tenants.acme]\nkeys = [{ sha256 = "nothex" }]\n')
        assert (await h.client.get("/swarms", headers=bearer(NEW_KEY))).status_code == 200
        # SIGHUP reads it at once, however long the mtime check waits
        ring.check_every_s = 3600.0
        write_tenants(tenants, f'[tenants.acme]\nkeys = [{{ sha256 = "{sha(OLD_KEY)}" }}]\n')
        error_of(await h.client.get("/swarms", headers=bearer(OLD_KEY)), 401)
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(100):
            if ring.find(OLD_KEY) is not None:
                break
            await asyncio.sleep(0.01)
        assert (await h.client.get("/swarms", headers=bearer(OLD_KEY))).status_code == 200
        error_of(await h.client.get("/swarms", headers=bearer(NEW_KEY)), 401)
    finally:
        await close()


async def test_a_key_in_both_places_is_one_key_with_the_files_scopes(
        database_url: str, tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    write_tenants(tenants, f'[tenants.acme]\nkeys = [{{ key = "{READ_KEY}", '
                           'scopes = ["swarms:read"] }]\n')
    h, close = await start_harness(make_settings(
        database_url, tenants_file=str(tenants), api_keys=f"acme:{READ_KEY},beta:kb"))
    try:
        assert (await h.client.get("/swarms", headers=bearer(READ_KEY))).status_code == 200
        error_of(await h.post(SWARM, headers=bearer(READ_KEY)), 403, "insufficient_scope")
        assert (await h.post(SWARM, headers=bearer("kb"))).status_code == 202  # env: all scopes
    finally:
        await close()


@pytest.mark.parametrize(("api_keys", "tenants", "why"), [
    ("a:sha256:abc", "", "64 hex digits"),
    ("a:k1", '[tenants.b]\nkeys = [{ key = "k1" }]', "twice"),
    ("", '[tenants.b]\nkeys = [{ key = "k1" }, { key = "k1" }]', "twice"),
    ("", '[tenants.b]\nkeys = [{ key = "k1", sha256 = "' + "0" * 64 + '" }]', "exactly one"),
    ("", '[tenants.b]\nkeys = [{ key = "k1", expires_at = 2027-01-01T00:00:00 }]', "time zone"),
    ("", '[tenants.b]\nkeys = [{ key = "k1", scopes = ["swarms:admin"] }]', "scopes"),
    ("", '[tenants.b]\nkeys = [{ key = "k1", id = "x" }, { key = "k2", id = "x" }]', "the id"),
    ("", '[defaults]\nkeys = [{ key = "k1" }]', "cannot list keys"),
])
def test_ambiguous_keys_are_refused_at_start(api_keys: str, tenants: str, why: str,
                                             tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(tenants)
    with pytest.raises(ValidationError, match=why):
        make_settings("sqlite+aiosqlite:///x.db", api_keys=api_keys,
                      tenants_file=str(path) if tenants else None)


async def test_logs_name_the_key_by_its_id_never_the_key(
        scoped: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    r = await scoped.post(SWARM, headers=bearer(WRITE_KEY))
    assert r.status_code == 202
    created = [rec for rec in caplog.records if "created" in rec.getMessage()]
    assert created and all(logs.fields(rec).get("key_id") == "ci" for rec in created)
    everything: list[Any] = [rec.getMessage() for rec in caplog.records]
    everything += [repr(logs.fields(rec)) for rec in caplog.records]
    assert not any(WRITE_KEY in line or sha(WRITE_KEY) in line for line in everything)


async def test_the_creation_span_names_the_key_by_its_id(sqlite_url: str,
                                                         tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    tracing.configure([SimpleSpanProcessor(exporter)], env={})
    tenants = tmp_path / "tenants.toml"
    write_tenants(tenants, TENANTS)
    try:
        h, close = await start_harness(make_settings(sqlite_url, tenants_file=str(tenants)))
        try:
            r = await h.post(SWARM, headers=bearer(WRITE_KEY))
            assert r.status_code == 202, r.text
        finally:
            await close()
        [create] = [s for s in exporter.get_finished_spans() if s.name == "create_swarm"]
        assert (create.attributes or {}).get("swarm_api.key_id") == "ci"
        everything = repr([(s.name, dict(s.attributes or {}))
                           for s in exporter.get_finished_spans()])
        assert WRITE_KEY not in everything and sha(WRITE_KEY) not in everything
    finally:
        tracing.shutdown()


async def test_the_access_log_names_the_key_by_its_id(
        database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tenants = tmp_path / "tenants.toml"
    write_tenants(tenants, TENANTS)
    h, close = await start_harness(make_settings(database_url, tenants_file=str(tenants),
                                                 access_log=True))
    try:
        caplog.set_level(logging.INFO, logger="swarm_api.access")
        assert (await h.client.get("/swarms", headers=bearer(READ_KEY))).status_code == 200
        error_of(await h.post(SWARM, headers=bearer(READ_KEY)), 403, "insufficient_scope")
        lines = [r for r in caplog.records if r.name == "swarm_api.access"]
        assert [(logs.fields(r)["http_status"], logs.fields(r).get("key_id"))
                for r in lines] == [(200, "dash"), (403, "dash")]
        assert not any(READ_KEY in repr(logs.fields(r)) for r in lines)
    finally:
        await close()


# ---- auth --------------------------------------------------------------------------------------

T1 = {"Authorization": "Bearer k1"}
T2 = {"Authorization": "Bearer k2"}


@pytest.fixture
async def authed(sqlite_url: str) -> AsyncIterator[Harness]:
    h, close = await start_harness(make_settings(sqlite_url, api_keys="t1:k1,t2:k2"))
    yield h
    await close()


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic azE="},
    {"Authorization": "Bearer"}, {"Authorization": "k1"}, {"Authorization": "Bearer k1k2"},
])
async def test_auth_required_on_every_swarm_route(authed: Harness,
                                                  headers: dict[str, str]) -> None:
    sid = (await authed.post(BODY, headers=T1)).json()["id"]
    for method, path, body in (("POST", "/swarms", BODY), ("GET", "/swarms", None),
                               ("GET", f"/swarms/{sid}", None),
                               ("POST", f"/swarms/{sid}/cancel", None),
                               ("GET", f"/swarms/{sid}/events", None)):
        r = await authed.client.request(method, path, json=body, headers=headers)
        error_of(r, 401, "unauthorized")
        assert r.headers["www-authenticate"].lower().startswith("bearer")
    ok = await authed.client.get("/swarms", headers=T1)
    assert [s["id"] for s in ok.json()["items"]] == [sid]


async def test_tenants_are_isolated(authed: Harness) -> None:
    sid = (await authed.post({"task": "t", "agents": [{"name": "a", "system_prompt": SLOW}]},
                             headers=T1)).json()["id"]
    error_of(await authed.client.get(f"/swarms/{sid}", headers=T2), 404, "not_found")
    error_of(await authed.client.get(f"/swarms/{sid}", params={"wait": 30}, headers=T2), 404,
             "not_found")
    error_of(await authed.client.get(f"/swarms/{sid}/events", headers=T2), 404, "not_found")
    error_of(await authed.client.post(f"/swarms/{sid}/cancel", headers=T2), 404, "not_found")
    assert (await authed.client.get("/swarms", headers=T2)).json()["items"] == []
    assert (await authed.client.get(f"/swarms/{sid}", headers=T1)).json()["status"] not in {
        "cancelled"}  # t2's cancel did nothing
    r = await authed.client.post(f"/swarms/{sid}/cancel", headers=T1)
    assert r.status_code == 202


async def test_idempotency_keys_are_per_tenant(authed: Harness) -> None:
    a = await authed.post(BODY, headers={**T1, "Idempotency-Key": "same"})
    b = await authed.post(BODY, headers={**T2, "Idempotency-Key": "same"})
    assert a.status_code == b.status_code == 202
    assert a.json()["id"] != b.json()["id"]
    c = await authed.post({**BODY, "task": "other"}, headers={**T2, "Idempotency-Key": "same"})
    error_of(c, 422, "idempotency_key_reused")


async def test_ops_routes_need_no_key(authed: Harness) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert (await authed.client.get(path)).status_code == 200, path
