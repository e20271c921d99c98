"""SPEC §3 validation of `POST /swarms`: every rule answers 4xx in the error shape, names the
offending field, and stores nothing."""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import assert_rejected, error_of, fields_named, swarm_count
from tests.validation_cases import REJECTED, A, body_with

BODY_OK: dict[str, Any] = {"task": "t", "agents": A}
MAX_AGENTS = 3
MAX_BODY = 2048


@pytest.fixture
async def small(sqlite_url: str) -> AsyncIterator[Harness]:
    """An app with a small agent limit and body limit."""
    h, close = await start_harness(
        make_settings(sqlite_url, max_agents=MAX_AGENTS, max_body_bytes=MAX_BODY))
    yield h
    await close()


@pytest.mark.parametrize(("body", "status", "code", "field"),
                         [pytest.param(*case[1:], id=case[0]) for case in REJECTED])
async def test_invalid_body_is_rejected_naming_the_field(
        small: Harness, body: Any, status: int, code: str, field: str) -> None:
    r = await small.client.post("/swarms", json=body)
    assert_rejected(r, status, code, field)
    assert await swarm_count(small.client) == 0


@pytest.mark.parametrize(("raw", "field"), [
    ('{"task": "t", "agents": [{"name": "a"}], "temperature": NaN}', "temperature"),
    ('{"task": "t", "agents": [{"name": "a", "weight": NaN}]}', "agents.0.weight"),
    ('{"task": "t", "agents": [{"name": "a"}], "limits": {"budget_usd": Infinity}}',
     "limits.budget_usd"),
    ('{"task": "t", "agents": [{"name": "a"}], "metadata": {"x": NaN}}', "metadata"),
    ('{"task": "t", "agents": [{"name": "a"}], "metadata": {"x": 1e999}}', "metadata"),
    ('{"task": "t", "agents": [{"name": "a"}], "metadata": {"x": "\\ud800"}}', "metadata"),
    ('{"task": "\\ud800", "agents": [{"name": "a"}]}', "task"),
    ('{"task": "t", "agents": [{"name": "a"}], "model": "\\udfff"}', "model"),
])
async def test_non_finite_numbers_and_lone_surrogates_are_422_not_500(
        api: Harness, raw: str, field: str) -> None:
    r = await api.client.post("/swarms", content=raw,
                              headers={"content-type": "application/json"})
    assert_rejected(r, 422, "validation_error", field)
    assert await swarm_count(api.client) == 0


@pytest.mark.parametrize("deps", [
    {"a": ["b"], "b": ["a"]},
    {"a": ["c"], "b": ["a"], "c": ["b"]},
])
async def test_dependency_cycle_is_named(api: Harness, deps: dict[str, list[str]]) -> None:
    agents = [{"name": n, "depends_on": d} for n, d in deps.items()]
    r = await api.client.post("/swarms", json={"task": "t", "agents": agents})
    err = error_of(r, 422, "dependency_cycle")
    cycle = err["details"]["cycle"]
    assert cycle[0] == cycle[-1] and set(cycle) == set(deps) and len(cycle) == len(deps) + 1
    for before, after in itertools.pairwise(cycle):
        assert after in deps[before], cycle  # "x -> y": x depends on y
    assert " -> ".join(cycle) in err["message"]
    assert err["details"]["field"].startswith("agents.")
    assert err["details"]["field"].endswith(".depends_on")
    assert await swarm_count(api.client) == 0


async def test_self_dependency_is_a_cycle(api: Harness) -> None:
    body = {"task": "t", "agents": [{"name": "ok"}, {"name": "me", "depends_on": ["me"]}]}
    err = error_of(await api.client.post("/swarms", json=body), 422, "dependency_cycle")
    assert err["details"]["cycle"] == ["me", "me"]
    assert "me -> me" in err["message"]
    assert err["details"]["field"] == "agents.1.depends_on"


async def test_unknown_dependency_names_it(api: Harness) -> None:
    body = {"task": "t", "agents": [{"name": "a", "depends_on": ["ghost"]}]}
    err = error_of(await api.client.post("/swarms", json=body), 422, "unknown_dependency")
    assert "ghost" in err["message"]
    assert err["details"]["unknown"] == "ghost"


async def test_unknown_model_lists_priced_models(api: Harness) -> None:
    err = error_of(await api.client.post("/swarms", json=body_with(model="gpt-9000")), 422,
                   "unknown_model")
    assert "gpt-9000" in err["message"] and "kimi-k2.5" in err["message"]


@pytest.mark.parametrize("body", [
    pytest.param({"task": "t", "agents": [{"name": "A-z_0.9"}, {"name": "b" * 64}]},
                 id="names-at-the-edge"),
    pytest.param({"task": "t", "agents": [{"name": f"a{i}"} for i in range(MAX_AGENTS)]},
                 id="max-agents"),
    pytest.param(body_with(limits={"budget_usd": 0.01, "failure_tolerance": 1}), id="limits-edge"),
    pytest.param(body_with(limits={"failure_tolerance": 0}), id="tolerance-0"),
    pytest.param({"task": "t", "max_tokens": 1,
                  "agents": [{"name": "a", "max_tokens": 128_000}],
                  "synthesis": {"max_tokens": 128_000}}, id="max-tokens-edge"),
    pytest.param(body_with(model="deepseek-v3.2", synthesis={"model": "gpt-4.1"},
                       orchestrator={"model": "gemini-2.5-flash"}), id="priced-models"),
    # JSON Schema's integer: 8.0 is one; a budget may be a decimal string (money)
    pytest.param(body_with(max_tokens=100.0, limits={"concurrency": 4.0, "max_attempts": 2.0}),
                 id="integral-floats"),
    pytest.param(body_with(limits={"budget_usd": "0.125"}), id="budget-decimal-string"),
    pytest.param(body_with(limits={"budget_usd": " +1.5e-2 "}), id="budget-exponent-string"),
])
async def test_valid_edges_are_accepted(small: Harness, body: dict[str, Any]) -> None:
    """The rules reject exactly the invalid side of each bound."""
    r = await small.client.post("/swarms", json=body)
    assert r.status_code == 202, r.text
    assert await swarm_count(small.client) == 1


async def test_numbers_are_kept_as_the_schema_types_them(small: Harness) -> None:
    """An integral float is the integer it names; a decimal-string budget its exact amount."""
    r = await small.client.post("/swarms", json=body_with(
        max_tokens=100.0, limits={"concurrency": 4.0, "budget_usd": "0.125"}))
    assert r.status_code == 202, r.text
    spec = r.json()["spec"]
    assert spec["max_tokens"] == 100 and isinstance(spec["max_tokens"], int)
    assert spec["limits"]["concurrency"] == 4 and isinstance(spec["limits"]["concurrency"], int)
    assert float(spec["limits"]["budget_usd"]) == 0.125


async def test_invalid_json_is_400(api: Harness) -> None:
    for raw in (b"{bad", b'{"task": "t"', b'{"task": "t"} trailing', b" "):
        r = await api.client.post("/swarms", content=raw,
                                  headers={"content-type": "application/json"})
        err = error_of(r, 400, "invalid_json")
        assert fields_named(err) == ["body"]
    assert await swarm_count(api.client) == 0


async def test_absurdly_nested_json_is_a_4xx(api: Harness) -> None:
    raw = '{"task": "t", "agents": [{"name": "a"}], "metadata": {"k": ' + "[" * 100_000
    raw += "]" * 100_000 + "}}"
    r = await api.client.post("/swarms", content=raw,
                              headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500
    error_of(r, r.status_code)


async def test_empty_body_is_422_naming_body(api: Harness) -> None:
    r = await api.client.post("/swarms", content=b"",
                              headers={"content-type": "application/json"})
    assert_rejected(r, 422, "validation_error", "body")


async def test_body_over_limit_with_content_length_is_413(small: Harness) -> None:
    body = json.dumps({"task": "x" * (MAX_BODY + 10), "agents": A}).encode()
    r = await small.client.post("/swarms", content=body,
                                headers={"content-type": "application/json"})
    assert r.request.headers["content-length"] == str(len(body))
    err = error_of(r, 413, "payload_too_large")
    assert err["details"]["limit"] == MAX_BODY
    assert await swarm_count(small.client) == 0


@pytest.mark.parametrize("coding", ["gzip", "br", "Deflate"])
async def test_compressed_body_is_415_naming_the_coding(small: Harness, coding: str) -> None:
    """A body in a content coding is refused for what it is (it read as "not valid JSON")."""
    raw = gzip.compress(json.dumps({"task": "t", "agents": A}).encode())
    r = await small.client.post("/swarms", content=raw, headers={
        "content-type": "application/json", "content-encoding": coding})
    err = error_of(r, 415, "unsupported_media_type")
    assert err["details"] == {"content_encoding": coding.lower()}
    assert r.headers["accept-encoding"] == "identity"
    assert await swarm_count(small.client) == 0


@pytest.mark.parametrize("media", [None, "text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "json",
                                   "application/json-seq"])
async def test_a_body_that_is_not_json_is_415_naming_its_type(small: Harness,
                                                             media: str | None) -> None:
    """A body of another type (`curl -d` sends a form) is refused for what it is, on every
    route that reads one, in the route's own error shape; JSON by any of its names is read."""
    raw = json.dumps({"task": "t", "agents": A}).encode()
    headers = {} if media is None else {"content-type": media}
    unknown = "00000000-0000-4000-8000-000000000000"
    for path in ("/swarms", f"/swarms/{unknown}/retry", f"/swarms/{unknown}/cancel"):
        r = await small.client.post(path, content=raw, headers=headers)
        err = error_of(r, 415, "unsupported_media_type")
        assert err["details"] == {"content_type": media}, path
        assert "application/json" in err["message"] and r.headers["accept-post"] == \
            "application/json"
    r = await small.client.post("/v1/chat/completions", content=raw, headers=headers)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert await swarm_count(small.client) == 0


async def test_json_by_any_of_its_names_is_read(small: Harness) -> None:
    raw = json.dumps({"task": "t", "agents": A}).encode()
    for media in ("application/json", "application/json; charset=utf-8", "Application/JSON",
                  " application/vnd.swarm+json ;v=1"):
        r = await small.client.post("/swarms", content=raw, headers={"content-type": media})
        assert r.status_code == 202, (media, r.text)
    unknown = "00000000-0000-4000-8000-000000000000"  # a body-less POST of any type is read
    r = await small.client.post(f"/swarms/{unknown}/cancel", headers={
        "content-type": "text/plain"})
    error_of(r, 404, "not_found")


async def test_identity_coding_and_bodiless_requests_are_read(small: Harness) -> None:
    body = json.dumps({"task": "t", "agents": A}).encode()
    r = await small.client.post("/swarms", content=body, headers={
        "content-type": "application/json", "content-encoding": "identity"})
    assert r.status_code == 202, r.text
    r = await small.client.get("/swarms", headers={"content-encoding": "gzip"})
    assert r.status_code == 200 and len(r.json()["items"]) == 1


async def test_body_over_limit_streamed_without_length_is_413(small: Harness) -> None:
    body = json.dumps({"task": "x" * (MAX_BODY + 10), "agents": A}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 256):
            yield body[i:i + 256]

    r = await small.client.post("/swarms", content=chunks(),
                                headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert r.request.headers["transfer-encoding"] == "chunked"
    error_of(r, 413, "payload_too_large")
    assert await swarm_count(small.client) == 0


async def test_body_just_under_limit_streamed_is_accepted(small: Harness) -> None:
    head = {"task": "", "agents": A}
    pad = MAX_BODY - len(json.dumps(head).encode())
    body = json.dumps({"task": "x" * pad, "agents": A}).encode()
    assert len(body) == MAX_BODY

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 300):
            yield body[i:i + 300]

    r = await small.client.post("/swarms", content=chunks(),
                                headers={"content-type": "application/json"})
    assert r.status_code == 202, r.text


async def test_what_postgres_cannot_store_is_4xx_on_every_backend(harness: Harness) -> None:
    """NUL characters, NaN/Infinity and lone surrogates are refused before the database sees
    them (PostgreSQL text and jsonb reject them: that used to be a 500)."""
    c = harness.client
    raws = ['{"task": "a\\u0000b", "agents": [{"name": "a"}]}',
            '{"task": "t", "agents": [{"name": "a", "prompt": "\\u0000"}]}',
            '{"task": "t", "agents": [{"name": "a"}], "metadata": {"k\\u0000": 1}}',
            '{"task": "t", "agents": [{"name": "a"}], "metadata": {"k": [NaN]}}',
            '{"task": "t", "agents": [{"name": "a"}], "metadata": {"k": "\\udc00"}}']
    for raw in raws:
        r = await c.post("/swarms", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422, (raw, r.text)
    r = await c.post("/swarms", json=BODY_OK, headers={"Idempotency-Key": "a\x00b"})
    assert_rejected(r, 422, "validation_error", "Idempotency-Key")
    for path in ("/swarms/a%00b", "/swarms/a%00b/events"):
        error_of(await c.get(path), 404, "not_found")
    error_of(await c.post("/swarms/a%00b/cancel"), 404, "not_found")
    assert await swarm_count(c) == 0
    # what is storable round-trips exactly
    task = "Überprüfe 支払い \u202e ✓ 😀 \t\n"
    meta = {"ключ": ["é", 1.5, -(2**53), None, True, {"deep": [[["ok"]]]}]}
    r = await c.post("/swarms", json={**BODY_OK, "task": task, "metadata": meta})
    assert r.status_code == 202, r.text
    got = (await c.get(r.headers["location"])).json()
    assert got["task"] == task and got["metadata"] == meta



async def test_only_methods_that_carry_a_body_are_limited(small: Harness) -> None:
    """413 and 415 answer the methods whose routes read a body, and every such route
    documents both; a GET's body is ignored (no route reads it), so no GET answers them."""
    big = b"x" * (MAX_BODY + 10)
    r = await small.client.request("GET", "/swarms", content=big)
    assert r.status_code == 200, r.text
    r = await small.client.request("GET", "/swarms", content=gzip.compress(b"{}"),
                                   headers={"content-encoding": "gzip"})
    assert r.status_code == 200, r.text
    unknown = "00000000-0000-4000-8000-000000000000"
    error_of(await small.client.post(f"/swarms/{unknown}/cancel", content=big), 413,
             "payload_too_large")
    error_of(await small.client.post(f"/swarms/{unknown}/cancel", content=b"{}",
                                     headers={"content-encoding": "gzip"}), 415)
    doc = (await small.client.get("/openapi.json")).json()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            limited = {"413", "415"} & set(op["responses"])
            assert limited == ({"413", "415"} if method in ("post", "put", "patch")
                               else set()), (method, path)
