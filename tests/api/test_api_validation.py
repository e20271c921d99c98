"""SPEC §3 validation of `POST /swarms`: every rule answers 4xx in the error shape, names the
offending field, and stores nothing."""

from __future__ import annotations

import gzip
import itertools
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import assert_rejected, error_of, fields_named, stored_swarms, swarm_count
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


# ---- property: no body makes a 5xx -------------------------------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.text(alphabet=st.characters(categories=["Cs", "Cc", "So", "Lo"]), max_size=8),
    st.sampled_from(["NaN", "Infinity", "-0", "1e309", "", " ", "kimi-k2.5", "a", "\x00"]),
    # what breaks renderers and databases rather than validators
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 2**63, -(2**63) - 1,
                     "\ud800", "a\x00b", "\u202e", "\U0001f600"]),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
_deep = st.integers(min_value=1, max_value=60).map(
    lambda n: json.loads("[" * n + "]" * n))
_garbage = st.one_of(_json, _deep)
_names = st.sampled_from(["a", "b", "c", "a b", "", "x" * 65, "é", "A-z_0.9"])
_models = st.sampled_from(["kimi-k2.5", "deepseek-v3.2", "gpt-4.1", "nope", ""])


def _maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the plausible value, sometimes anything at all."""
    return st.one_of(*[valid] * 6, _garbage)


def _with_extra(d: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    extra = st.dictionaries(st.text(min_size=1, max_size=8), _garbage, max_size=2)
    return st.one_of(d, st.tuples(d, extra).map(lambda t: {**t[1], **t[0]}))


_agent_st = _with_extra(st.fixed_dictionaries({"name": _maybe(_names)}, optional={
    "system_prompt": _maybe(st.text(max_size=20)),
    "prompt": _maybe(st.text(max_size=20)),
    "model": _maybe(_models),
    "max_tokens": _maybe(st.integers(min_value=-5, max_value=200_000)),
    "temperature": _maybe(st.floats(min_value=-1, max_value=3)),
    "depends_on": _maybe(st.lists(_names, max_size=3)),
    "weight": _maybe(st.floats(min_value=-1, max_value=10)),
}))
_limits_st = _with_extra(st.fixed_dictionaries({}, optional={
    "concurrency": _maybe(st.integers(min_value=-1, max_value=2000)),
    "budget_usd": _maybe(st.one_of(st.floats(min_value=-1, max_value=100),
                                   st.decimals(allow_nan=True).map(str))),
    "failure_tolerance": _maybe(st.floats(min_value=-0.5, max_value=1.5)),
    "max_attempts": _maybe(st.integers(min_value=-1, max_value=20)),
    "subtask_timeout_s": _maybe(st.floats(min_value=-1, max_value=5000)),
    "deadline_s": _maybe(st.floats(min_value=-1, max_value=100_000)),
}))
_synthesis_st = _with_extra(st.fixed_dictionaries({}, optional={
    "strategy": _maybe(st.sampled_from(["synthesize", "concatenate", "vote", "none", "x"])),
    "model": _maybe(_models),
    "max_tokens": _maybe(st.integers(min_value=-5, max_value=200_000)),
    "compress": _maybe(st.sampled_from(["auto", "always", "never", "x"])),
}))
_orchestrator_st = _with_extra(st.fixed_dictionaries({}, optional={
    "model": _maybe(_models),
    "max_subtasks": _maybe(st.integers(min_value=-1, max_value=2000)),
    "max_depth": _maybe(st.integers(min_value=-1, max_value=30)),
}))


@st.composite
def _valid_body(draw: st.DrawFn) -> dict[str, Any]:
    """A body that must be accepted: unique names, dependencies on earlier agents only."""
    names = draw(st.lists(st.from_regex(r"[A-Za-z0-9_.\-]{1,64}", fullmatch=True),
                          min_size=1, max_size=4, unique=True))
    agents = [{"name": n, "depends_on": draw(st.lists(st.sampled_from(names[:i]), unique=True))
               if i else [], "model": draw(st.sampled_from(["kimi-k2.5", "deepseek-v3.2"]))}
              for i, n in enumerate(names)]
    # valid text is what UTF-8 can carry (lone surrogates are refused on purpose) minus NUL
    valid_text = st.characters(codec="utf-8", exclude_characters="\x00")
    return {"task": draw(st.text(valid_text, min_size=1, max_size=30).filter(str.strip)),
            "agents": agents,
            "max_tokens": draw(st.integers(min_value=1, max_value=128_000)),
            "limits": {"budget_usd": draw(st.decimals(min_value="0.01", max_value="100",
                                                      places=2).map(float)),
                       "failure_tolerance": draw(st.floats(min_value=0, max_value=1))},
            # NUL is rejected on purpose (Postgres cannot store it): valid keys exclude it
            "metadata": draw(st.dictionaries(st.text(valid_text, max_size=8), st.integers(),
                                             max_size=2))}


_body_st = st.one_of(
    _valid_body(),
    _with_extra(st.fixed_dictionaries(
        {"task": _maybe(st.text(max_size=30)),
         "agents": _maybe(st.lists(_agent_st, min_size=1, max_size=4))},
        optional={
            "limits": _maybe(_limits_st),
            "synthesis": _maybe(_synthesis_st),
            "orchestrator": _maybe(_orchestrator_st),
            "model": _maybe(_models),
            "max_tokens": _maybe(st.integers(min_value=-5, max_value=200_000)),
            "temperature": _maybe(st.floats(min_value=-1, max_value=3)),
            "metadata": _maybe(st.dictionaries(st.text(max_size=8), _json, max_size=3)),
        })),
    _garbage,
)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=_body_st)
async def test_no_body_makes_a_5xx(api: Harness, body: Any) -> None:
    raw = json.dumps(body, allow_nan=True)  # NaN/Infinity literals too: Python parsers take them
    before = await stored_swarms(api)
    r = await api.client.post("/swarms", content=raw,
                              headers={"content-type": "application/json"})
    assert r.status_code < 500, r.text
    event(f"status {r.status_code}")
    if r.status_code == 202:
        data = r.json()
        assert r.headers["location"] == f"/swarms/{data['id']}"
        assert data["task"] == body["task"]
        assert await stored_swarms(api) == before + 1
    else:
        assert 400 <= r.status_code < 500
        err = error_of(r, r.status_code)
        if r.status_code == 422 and err["code"] != "planning_not_available":
            assert fields_named(err)
        assert await stored_swarms(api) == before


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=_valid_body())
async def test_valid_bodies_are_accepted(api: Harness, body: dict[str, Any]) -> None:
    r = await api.client.post("/swarms", json=body)
    assert r.status_code == 202, r.text
    assert [s["name"] for s in r.json()["subtasks"]][:len(body["agents"])] == [
        a["name"] for a in body["agents"]]


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
