"""The OpenAPI document is complete and true: every SPEC §3 route, every status it answers with
its schema, and real answers validate against what the document declares."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import ValidationError

from app.aio import wait_for
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import BODY, SLOW, agent, sse_events
from tests.procs import cluster, wait_http
from tests.support import free_port

ERROR_REF = "#/components/schemas/ErrorResponse"
OPENAI_ERROR_REF = "#/components/schemas/OpenAIError"  # the /v1 facade speaks OpenAI's shape
KEY = {"Authorization": "Bearer k1"}
MAX_BODY = 4096

# SPEC §3: route -> the statuses it must document (503: the database is unreachable)
SPEC_ROUTES: dict[tuple[str, str], set[int]] = {
    # 429: a tenant quota (SPEC §8): the bucket and counts at creation, max_streams for
    # ?wait= and the event stream
    ("post", "/swarms"): {202, 400, 401, 413, 422, 429, 503},
    ("get", "/swarms"): {200, 401, 422, 503},
    ("get", "/swarms/{swarm_id}"): {200, 401, 404, 422, 429, 503},
    ("post", "/swarms/{swarm_id}/cancel"): {202, 401, 404, 409, 503},
    ("post", "/swarms/{swarm_id}/retry"): {202, 401, 404, 409, 422, 429, 503},  # SPEC §11
    ("get", "/swarms/{swarm_id}/events"): {200, 400, 401, 404, 429, 503},
    ("get", "/usage"): {200, 401, 422, 503},
    ("get", "/healthz"): {200},
    ("get", "/readyz"): {200, 503},
    ("get", "/metrics"): {200},
    ("get", "/tools"): {200, 401},
    ("get", "/swarms/{swarm_id}/subtasks/{name}"): {200, 401, 404, 503},
    # SPEC §14 (403: a key without the route's scope, SPEC §16)
    ("post", "/swarms/estimate"): {200, 401, 403, 422, 503},
    ("post", "/swarms/{swarm_id}/approve"): {202, 401, 404, 409, 422, 503},
    ("post", "/swarms/{swarm_id}/reject"): {202, 401, 404, 409, 503},
    # SPEC §16
    ("delete", "/swarms/{swarm_id}"): {204, 401, 403, 404, 409, 503},
    ("get", "/audit"): {200, 401, 403, 422, 503},
}


# ---- the document's schemas, checked by jsonschema with every described object closed --------


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The schema a `$ref` (or a chain of them) points at in the document."""
    while "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/"), ref
        node: Any = doc
        for part in ref[2:].split("/"):
            node = node[part]
        schema = node
    return schema


def _closed_properties(validator: Any, properties: dict[str, Any], instance: Any,
                       schema: dict[str, Any]) -> Iterator[ValidationError]:
    """`properties` as JSON Schema checks it, and where the schema says nothing of other keys, a
    key it does not declare is an error: the document must describe every field it answers."""
    yield from Draft202012Validator.VALIDATORS["properties"](validator, properties, instance,
                                                             schema)
    if validator.is_type(instance, "object") and "additionalProperties" not in schema:
        for key in instance.keys() - properties.keys():
            yield ValidationError(f"undocumented key {key!r}")


DocumentValidator = validators.extend(Draft202012Validator, {"properties": _closed_properties})
# a date-time as the service writes it (ISO 8601 with its offset), read as Python reads it
FORMATS = FormatChecker(())


@FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    return not isinstance(value, str) or bool(datetime.fromisoformat(value))


def schema_errors(doc: dict[str, Any], schema: dict[str, Any], value: Any) -> list[str]:
    """Where `value` breaks `schema`, its `#/components/...` references read from `doc`."""
    root = {**schema, "components": doc.get("components", {})}
    return [f"{error.json_path}: {error.message}" for error in
            DocumentValidator(root, format_checker=FORMATS).iter_errors(value)]


def test_validator_rejects_what_it_should() -> None:
    """The checker above can fail (so the truthfulness test below means something)."""
    doc = {"components": {"schemas": {"X": {
        "type": "object", "required": ["a"],
        "properties": {"a": {"type": "integer"},
                       "b": {"anyOf": [{"type": "string", "format": "date-time"},
                                       {"type": "null"}]},
                       "c": {"type": "array", "items": {"enum": ["x", "y"]}}}}}}}
    ref = {"$ref": "#/components/schemas/X"}
    assert schema_errors(doc, ref, {"a": 1, "b": "2024-01-01T00:00:00Z", "c": ["x"]}) == []
    assert schema_errors(doc, ref, {"a": 1, "b": None}) == []
    assert schema_errors(doc, ref, {"b": None})  # missing a
    assert schema_errors(doc, ref, {"a": "1"})  # wrong type
    assert schema_errors(doc, ref, {"a": True})  # a bool is not an integer
    assert schema_errors(doc, ref, {"a": 1, "b": "yesterday"})  # not a date-time
    assert schema_errors(doc, ref, {"a": 1, "c": ["z"]})  # enum
    assert schema_errors(doc, ref, {"a": 1, "zzz": 1})  # undocumented key
    assert schema_errors(doc, ref, [])


def test_event_schema_rejects_what_it_should() -> None:
    from app.api.sse import EVENT_SCHEMA

    ok = {"id": "1", "event": "swarm.status", "data": '{"seq": 1}'}
    assert schema_errors({}, EVENT_SCHEMA, ok) == []
    assert schema_errors({}, EVENT_SCHEMA, {**ok, "id": "0"})
    assert schema_errors({}, EVENT_SCHEMA, {**ok, "event": "message"})
    assert schema_errors({}, EVENT_SCHEMA, {"id": "1", "event": "swarm.status"})


# ---- the document ------------------------------------------------------------------------------


@pytest.fixture
async def live(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    """Auth on, a small body limit and a tenant with tight quotas (t2), so every documented
    status can be provoked."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text("[tenants.t2]\nrequests_per_minute = 1\nburst = 1\nmax_streams = 0\n"
                       '[tenants.t3]\nkeys = [{ key = "k3", scopes = ["swarms:read"] }]\n')
    h, close = await start_harness(make_settings(sqlite_url, api_keys="t1:k1,t2:k2",
                                                 max_body_bytes=MAX_BODY,
                                                 tenants_file=str(tenants)))
    yield h
    await close()


async def _doc(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    return doc


async def test_every_spec_route_and_status_is_documented(api: Harness) -> None:
    doc = await _doc(api.client)
    for (method, path), statuses in SPEC_ROUTES.items():
        assert path in doc["paths"], path
        op = doc["paths"][path].get(method)
        assert op is not None, (method, path)
        documented = {int(s) for s in op["responses"]}
        assert statuses <= documented, (method, path, statuses - documented)
        assert op.get("summary"), (method, path)


async def test_every_error_response_uses_the_error_schema(api: Harness) -> None:
    doc = await _doc(api.client)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, response in op["responses"].items():
                if int(status) < 400:
                    continue
                content = response.get("content", {})
                assert list(content) == ["application/json"], (method, path, status)
                ref = OPENAI_ERROR_REF if path.startswith("/v1/") else ERROR_REF
                assert content["application/json"]["schema"] == {"$ref": ref}, (
                    method, path, status)
                # each with an example answer in that shape (405/406: the router's own)
                if int(status) not in (405, 406):
                    example = content["application/json"].get("example")
                    assert example is not None, (method, path, status)
                    assert schema_errors(doc, {"$ref": ref}, example) == [], (
                        method, path, status)
    assert "HTTPValidationError" not in str(doc["paths"])
    error = doc["components"]["schemas"]["ErrorResponse"]
    body = _resolve(doc, error["properties"]["error"])
    assert set(body["properties"]) == {"code", "message", "details"}
    assert set(body["required"]) >= {"code", "message"}


async def test_create_documents_its_request_with_an_example(api: Harness) -> None:
    doc = await _doc(api.client)
    op = doc["paths"]["/swarms"]["post"]
    media = op["requestBody"]["content"]["application/json"]
    schema = _resolve(doc, media["schema"])
    assert schema["required"] == ["task"]
    assert schema.get("additionalProperties") is False
    examples = ([media["example"]] if "example" in media else []) + [
        e["value"] for e in media.get("examples", {}).values()] + schema.get("examples", [])
    assert examples, "POST /swarms has no request example"
    for example in examples:
        assert schema_errors(doc, media["schema"], example) == []
        assert example["agents"] and example["task"]
    # the example is not only well-formed: the service accepts it
    r = await api.post(examples[0])
    assert r.status_code == 202, r.text
    assert "202" in op["responses"] and op["responses"]["202"]["content"]["application/json"][
        "schema"] == {"$ref": "#/components/schemas/SwarmRead"}
    header = next(p for p in op["parameters"] if p["name"] == "Idempotency-Key")
    assert header["in"] == "header" and header["schema"]["anyOf"][0]["maxLength"] == 255


async def test_documented_parameters_match_the_checks(api: Harness) -> None:
    doc = await _doc(api.client)

    def param(path: str, name: str) -> dict[str, Any]:
        op = doc["paths"][path]["get"]
        found: dict[str, Any] = next(p for p in op["parameters"] if p["name"] == name)
        return found

    def bounds(schema: dict[str, Any]) -> dict[str, Any]:
        branches: list[dict[str, Any]] = schema.get("anyOf", [schema])
        for branch in branches:
            if branch.get("type") != "null":
                return branch
        raise AssertionError(schema)

    wait = bounds(param("/swarms/{swarm_id}", "wait")["schema"])
    assert (wait["minimum"], wait["maximum"]) == (0, 60)
    limit = bounds(param("/swarms", "limit")["schema"])
    assert (limit["minimum"], limit["maximum"]) == (1, 200)
    status = _resolve(doc, bounds(param("/swarms", "status")["schema"]))
    assert set(status["enum"]) == {"queued", "planning", "awaiting_approval", "running",
                                   "synthesizing", "succeeded", "failed", "cancelled"}
    last_event_id = param("/swarms/{swarm_id}/events", "Last-Event-ID")
    assert last_event_id["in"] == "header"
    # the documented pattern refuses what the route refuses with 400 (the bound, 2^31 - 1, is
    # in the description: tests/api/test_api_routes.py holds the route to it)
    pattern = re.compile(last_event_id["schema"]["pattern"])
    for refused in ("abc", "1.5", "3x", "-1", "٣", "1_0", "99999999999999999999999"):
        assert not pattern.search(refused), refused
    for taken in ("", "0", "17", "2147483647"):
        assert pattern.search(taken), taken
    assert "2147483647" in last_event_id["description"]
    # /usage's bounds are documented as read, a day or an instant, and their examples work
    for name in ("from", "to"):
        bound = param("/usage", name)
        formats = {b.get("format") for b in bound["schema"]["anyOf"] if b.get("type") != "null"}
        assert formats == {"date", "date-time"}, bound
        for example in bound["examples"].values():
            r = await api.client.get("/usage", params={name: example["value"]})
            assert r.status_code == 200, (name, example, r.text)
    events_ok = doc["paths"]["/swarms/{swarm_id}/events"]["get"]["responses"]["200"]
    assert list(events_ok["content"]) == ["text/event-stream"]
    metrics_ok = doc["paths"]["/metrics"]["get"]["responses"]["200"]
    assert list(metrics_ok["content"]) == ["text/plain"]


async def test_the_budget_pattern_says_which_strings_are_read(api: Harness) -> None:
    """`limits.budget_usd` may be a decimal string: its documented pattern takes what the route
    reads and refuses what it refuses (above 0 and the digit bounds are the validator's); a
    retry's budget is never null (it would drop the tenant's budget quotas)."""
    doc = await _doc(api.client)

    def budget(model: str) -> list[dict[str, Any]]:
        branches: list[dict[str, Any]] = doc["components"]["schemas"][model]["properties"][
            "budget_usd"]["anyOf"]
        return branches

    string = next(b for b in budget("Limits") if b.get("type") == "string")
    pattern = re.compile(string["pattern"])
    one = {"task": "t", "agents": [{"name": "a"}], "synthesis": {"strategy": "none"}}
    for taken in ("5", "0.125", " 2 ", "1e1", ".5", "+3.", "1.5E-2"):
        assert pattern.search(taken), taken
        r = await api.post({**one, "limits": {"budget_usd": taken}})
        assert r.status_code == 202, (taken, r.text)
    for refused in ("", "abc", "1_0", "\u0661", "-1", "Infinity", "NaN", "1 0", "0x1"):
        assert not pattern.search(refused), refused
        r = await api.post({**one, "limits": {"budget_usd": refused}})
        assert r.status_code == 422, (refused, r.text)
    assert {"type": "null"} in budget("Limits")
    assert [b.get("type") for b in budget("RetryLimits")] == ["number", "string"]
    assert next(b for b in budget("RetryLimits") if b.get("type") == "string") == string


async def test_the_bearer_key_is_documented_where_a_route_needs_one(sqlite_url: str) -> None:
    """With SWARM_API_KEYS, `Authorization: Bearer <key>` is a security scheme, required by
    every route that answers 401 (every one but the probes and the metrics), not a header
    parameter."""
    h, close = await start_harness(make_settings(sqlite_url, api_keys="t1:k1"))
    try:
        doc = await _doc(h.client)
    finally:
        await close()
    scheme = doc["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            keyless = path in ("/healthz", "/readyz", "/metrics")
            assert op.get("security") == (None if keyless else [{"bearer": []}]), (method, path)
            assert ("401" in op["responses"]) is not keyless, (method, path)
            assert "authorization" not in {p["name"].lower() for p in op.get("parameters", [])}


async def test_an_open_api_documents_no_key(api: Harness) -> None:
    """Without SWARM_API_KEYS no route needs a key, and the document says none (a generated
    client would send one; a conformance check would expect a 401 without it)."""
    doc = await _doc(api.client)
    assert "securitySchemes" not in doc.get("components", {})
    assert not [(m, p) for p, ops in doc["paths"].items() for m, op in ops.items()
                if "security" in op]


async def test_docs_page_is_served(api: Harness) -> None:
    r = await api.client.get("/docs")
    assert r.status_code == 200 and "swagger" in r.text.lower()


# ---- truthfulness: real answers match the document ----------------------------------------------


async def _exercise(h: Harness) -> list[tuple[str, str, httpx.Response]]:
    """One real answer per (route, status) this suite provokes: (method, template, response)."""
    c = h.client
    out: list[tuple[str, str, httpx.Response]] = []

    def add(method: str, template: str, r: httpx.Response) -> httpx.Response:
        out.append((method, template, r))
        return r

    created = add("post", "/swarms", await c.post("/swarms", json=BODY, headers=KEY))
    sid = created.json()["id"]
    add("post", "/swarms", await c.post("/swarms", json={**BODY, "task": "other"},
                                        headers={**KEY, "Idempotency-Key": "k"}))
    add("post", "/swarms", await c.post("/swarms", json=BODY,
                                        headers={**KEY, "Idempotency-Key": "k"}))
    add("post", "/swarms", await c.post("/swarms", content=b"{", headers={
        **KEY, "content-type": "application/json"}))
    add("post", "/swarms", await c.post("/swarms", json={**BODY, "task": "x" * MAX_BODY},
                                        headers=KEY))
    add("post", "/swarms", await c.post("/swarms", json={**BODY, "bogus": 1}, headers=KEY))
    add("post", "/swarms", await c.post("/swarms", json={**BODY, "model": "nope"}, headers=KEY))
    add("post", "/swarms", await c.post("/swarms", json={"task": "t", "agents": [
        {"name": "a", "depends_on": ["a"]}]}, headers=KEY))
    add("post", "/swarms", await c.post("/swarms", json=BODY))
    quota = {"Authorization": "Bearer k2"}  # tenant t2: one request a minute, no streams
    # still running when cancelled (at the simulator's 0 ms a swarm of BODY could end first,
    # and a succeeded swarm's cancel and retry answer 409); retryable once cancelled, its retry
    # then finds the minute's one request spent (429)
    slow = {**BODY, "agents": [agent("slow", SLOW)]}
    t2 = add("post", "/swarms", await c.post("/swarms", json=slow, headers=quota)).json()["id"]
    add("post", "/swarms/{swarm_id}/cancel", await c.post(f"/swarms/{t2}/cancel", headers=quota))
    for _ in range(200):
        if (await c.get(f"/swarms/{t2}", headers=quota)).json()["status"] == "cancelled":
            break
        await asyncio.sleep(0.05)
    add("post", "/swarms/{swarm_id}/retry", await c.post(f"/swarms/{t2}/retry", headers=quota))
    add("post", "/swarms", await c.post("/swarms", json=BODY, headers=quota))
    add("get", "/swarms/{swarm_id}", await c.get(f"/swarms/{t2}", params={"wait": 1},
                                                 headers=quota))
    add("get", "/swarms/{swarm_id}/events", await c.get(f"/swarms/{t2}/events", headers=quota))

    done = add("get", "/swarms/{swarm_id}", await c.get(f"/swarms/{sid}", params={"wait": 20},
                                                        headers=KEY))
    assert done.json()["status"] == "succeeded", done.text  # so its event stream ends
    add("get", "/swarms/{swarm_id}", await c.get(f"/swarms/{sid}", params={"wait": 61},
                                                 headers=KEY))
    add("get", "/swarms/{swarm_id}", await c.get("/swarms/nope", headers=KEY))
    add("get", "/swarms/{swarm_id}", await c.get(f"/swarms/{sid}"))

    add("get", "/swarms", await c.get("/swarms", headers=KEY))
    add("get", "/swarms", await c.get("/swarms", params={"limit": 1}, headers=KEY))
    add("get", "/swarms", await c.get("/swarms", params={"status": "x"}, headers=KEY))
    add("get", "/swarms", await c.get("/swarms", params={"cursor": "x"}, headers=KEY))
    add("get", "/swarms", await c.get("/swarms"))

    slow = await c.post("/swarms", json={"task": "t", "agents": [
        {"name": "a", "system_prompt": SLOW}]}, headers=KEY)
    add("post", "/swarms/{swarm_id}/cancel",
        await c.post(f"/swarms/{slow.json()['id']}/cancel", headers=KEY))
    add("post", "/swarms/{swarm_id}/cancel", await c.post(f"/swarms/{sid}/cancel", headers=KEY))
    add("post", "/swarms/{swarm_id}/cancel", await c.post("/swarms/nope/cancel", headers=KEY))
    add("post", "/swarms/{swarm_id}/cancel", await c.post(f"/swarms/{sid}/cancel"))

    failed = await c.post("/swarms", json={"task": "t", "agents": [
        {"name": "a", "system_prompt": "[[sim fail=400]]"}]}, headers=KEY)
    failed_id = failed.json()["id"]
    assert (await c.get(f"/swarms/{failed_id}", params={"wait": 20}, headers=KEY)).json()[
        "status"] == "failed"
    retried = add("post", "/swarms/{swarm_id}/retry",
                  await c.post(f"/swarms/{failed_id}/retry", headers=KEY))
    add("get", "/swarms", await c.get("/swarms", params={"retry_of": failed_id}, headers=KEY))
    add("get", "/swarms/{swarm_id}", await c.get(retried.headers["location"], headers=KEY))
    add("post", "/swarms/{swarm_id}/retry", await c.post(f"/swarms/{sid}/retry", headers=KEY))
    add("post", "/swarms/{swarm_id}/retry", await c.post("/swarms/nope/retry", headers=KEY))
    add("post", "/swarms/{swarm_id}/retry", await c.post(
        f"/swarms/{failed_id}/retry", json={"limits": {"budget_usd": -1}}, headers=KEY))
    add("post", "/swarms/{swarm_id}/retry", await c.post(f"/swarms/{failed_id}/retry"))

    add("get", "/swarms/{swarm_id}/events", await wait_for(
        c.get(f"/swarms/{sid}/events", headers=KEY), 10))
    add("get", "/swarms/{swarm_id}/events", await c.get(
        f"/swarms/{sid}/events", headers={**KEY, "Last-Event-ID": "x"}))
    add("get", "/swarms/{swarm_id}/events", await c.get("/swarms/nope/events", headers=KEY))
    add("get", "/swarms/{swarm_id}/events", await c.get(f"/swarms/{sid}/events"))

    for params in ({}, {"group_by": "day", "from": "2020-01-01"}, {"group_by": "tenant"}):
        add("get", "/usage", await c.get("/usage", params=params, headers=KEY))
    add("get", "/usage", await c.get("/usage", params={"group_by": "colour"}, headers=KEY))
    add("get", "/usage", await c.get("/usage", params={"from": "yesterday"}, headers=KEY))
    add("get", "/usage", await c.get("/usage"))

    add("get", "/tools", await c.get("/tools", headers=KEY))
    add("get", "/tools", await c.get("/tools"))
    one = "/swarms/{swarm_id}/subtasks/{name}"
    add("get", one, await c.get(f"/swarms/{sid}/subtasks/analyst", headers=KEY))
    add("get", one, await c.get(f"/swarms/{sid}/subtasks/nobody", headers=KEY))
    add("get", one, await c.get(f"/swarms/{sid}/subtasks/analyst"))

    add("get", "/healthz", await c.get("/healthz"))
    await _exercise_lifecycle(c, sid, add)
    add("get", "/readyz", await c.get("/readyz"))
    add("get", "/metrics", await c.get("/metrics"))
    return out


Add = Callable[[str, str, httpx.Response], httpx.Response]


async def _exercise_lifecycle(c: httpx.AsyncClient, sid: str, add: Add) -> None:
    """SPEC §14 and §16: estimate, approve, reject, erase and the audit trail; `sid` has ended."""
    reader = {"Authorization": "Bearer k3"}  # tenant t3: a key with swarms:read only
    add("post", "/swarms/estimate", await c.post("/swarms/estimate", json=BODY, headers=KEY))
    add("post", "/swarms/estimate", await c.post("/swarms/estimate", json={"task": ""},
                                                 headers=KEY))
    add("post", "/swarms/estimate", await c.post("/swarms/estimate", json=BODY))
    add("post", "/swarms/estimate", await c.post("/swarms/estimate", json=BODY, headers=reader))

    gated = {**BODY, "limits": {"approval": "always"}}
    held = [(await c.post("/swarms", json=gated, headers=KEY)).json()["id"] for _ in range(2)]
    for swarm_id in held:
        for _ in range(200):
            got = await c.get(f"/swarms/{swarm_id}", headers=KEY)
            if got.json()["status"] == "awaiting_approval":
                break
            await asyncio.sleep(0.05)
    approve, reject = "/swarms/{swarm_id}/approve", "/swarms/{swarm_id}/reject"
    add("post", approve, await c.post(f"/swarms/{held[0]}/approve", json={"agents": [
        {"name": "a", "depends_on": ["a"]}]}, headers=KEY))
    add("post", approve, await c.post(f"/swarms/{held[0]}/approve", headers=KEY))
    add("post", approve, await c.post(f"/swarms/{held[0]}/approve", headers=KEY))
    add("post", approve, await c.post("/swarms/nope/approve", headers=KEY))
    add("post", approve, await c.post(f"/swarms/{held[1]}/approve"))
    add("post", reject, await c.post(f"/swarms/{held[1]}/reject", json={"reason": "no"},
                                     headers=KEY))
    add("post", reject, await c.post(f"/swarms/{held[1]}/reject", headers=KEY))
    add("post", reject, await c.post("/swarms/nope/reject", headers=KEY))
    add("post", reject, await c.post(f"/swarms/{held[1]}/reject"))

    erase = "/swarms/{swarm_id}"
    running = (await c.post("/swarms", json={"task": "t", "agents": [agent("a", SLOW)]},
                            headers=KEY)).json()["id"]
    add("delete", erase, await c.delete(f"/swarms/{running}", headers=KEY))
    add("delete", erase, await c.delete(f"/swarms/{sid}", headers=reader))
    add("delete", erase, await c.delete(f"/swarms/{sid}"))
    add("delete", erase, await c.delete("/swarms/nope", headers=KEY))
    add("delete", erase, await c.delete(f"/swarms/{held[1]}", headers=KEY))
    await c.post(f"/swarms/{running}/cancel", headers=KEY)

    add("get", "/audit", await c.get("/audit", params={"limit": 2}, headers=KEY))
    add("get", "/audit", await c.get("/audit", params={"action": "dance"}, headers=KEY))
    add("get", "/audit", await c.get("/audit", headers=reader))
    add("get", "/audit", await c.get("/audit"))


async def test_every_answer_matches_what_the_document_declares(live: Harness) -> None:
    doc = await _doc(live.client)
    answers = await _exercise(live)
    seen: set[tuple[str, str, int]] = set()
    for method, template, r in answers:
        where = f"{method.upper()} {template} -> {r.status_code}"
        responses = doc["paths"][template][method]["responses"]
        assert str(r.status_code) in responses, f"{where} is not documented: {r.text[:200]}"
        content = responses[str(r.status_code)].get("content", {})
        if r.status_code == 204:  # no body, and none documented
            assert r.content == b"" and content == {}, where
            seen.add((method, template, r.status_code))
            continue
        media = r.headers["content-type"].split(";")[0]
        assert media in content, f"{where}: answered {media}, documents {list(content)}"
        if media == "application/json":
            errors = schema_errors(doc, content[media]["schema"], r.json())
            assert errors == [], f"{where}: {errors}"
        if media == "text/event-stream":
            events = sse_events(r.text)
            assert events, where
            for event in events:  # each event, as a schema-aware SSE client checks it
                schema = content[media]["schema"]
                assert schema_errors(doc, schema, event) == [], (where, event)
                # the branch the event matches (a stored event, or a delta) describes its data
                (branch,) = [b for b in schema.get("anyOf", [schema])
                             if schema_errors(doc, b, event) == []]
                data = json.loads(event["data"])
                assert schema_errors(doc, branch["properties"]["data"]["contentSchema"],
                                     data) == [], (where, data)
        seen.add((method, template, r.status_code))
    # the exercise really covered every documented status of SPEC §3 but the unprovokable 503
    wanted = {(m, p, s) for (m, p), ss in SPEC_ROUTES.items() for s in ss if s != 503}
    assert wanted <= seen, wanted - seen


# ---- schemathesis against a live server --------------------------------------------------------

ST = str(Path(sys.executable).with_name("st"))
PHASES = ("examples", "coverage", "fuzzing", "stateful")
# every check but positive_data_acceptance, which takes a well-formed value the server cannot
# know (a cursor, an Idempotency-Key already used with another body, a swarm not yet
# terminal to retry) for a valid request the server must accept, and use_after_free, which
# wants a DELETEd resource gone: `DELETE /swarms/{id}` erases a swarm's content and the swarm
# stays, answering `"erased": true` with its usage (tests/api/test_erase.py)
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance",
          "negative_data_rejection", "missing_required_header", "unsupported_method",
          "allow_header_conformance", "ensure_resource_availability", "ignored_auth")
# a fixed seed and a bound that fits the suite: each phase, every operation, ~1 minute
ST_SEED, ST_MAX_EXAMPLES = 1, 10


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(600)
async def test_schemathesis_finds_no_failure_against_a_live_server(db_url: str,
                                                                    tmp_path: Path) -> None:
    """Every phase of schemathesis 4 (examples, coverage, fuzzing, stateful) against a real
    `swarm-api serve` (engine, in-process simulator) on PostgreSQL: no 5xx, every status
    documented, every answer — each event of the streams included — valid for its schema,
    the schema-violating requests it makes refused, a 405's `Allow` the path's methods."""
    async with cluster(db_url, tmp_path) as c:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        serve = c.spawn("serve", ["serve", "--port", str(port)], SWARM_API_KEYS="t1:k1",
                        SWARM_SIMULATOR_LATENCY_MS="5", SWARM_SIMULATOR_LATENCY_JITTER_MS="0",
                        SWARM_MAX_AGENTS="20")
        await wait_http(serve, f"{base}/readyz", ok_only=True)
        st = await asyncio.create_subprocess_exec(
            ST, "run", f"{base}/openapi.json", "--header", "Authorization: Bearer k1",
            "--checks", ",".join(CHECKS),
            "--phases", ",".join(PHASES), "--seed", str(ST_SEED),
            "--max-examples", str(ST_MAX_EXAMPLES), "--request-timeout", "60",
            "--generation-database", "none", "--no-color",
            cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            out, _ = await wait_for(st.communicate(), 540)
        finally:
            if st.returncode is None:
                st.kill()
                await st.wait()
        report = out.decode(errors="replace")
        assert st.returncode == 0, report[-8000:]
        log = serve.log()  # nothing failed on the server side either
        assert " ERROR " not in log and "Traceback" not in log, log[-4000:]
    summary = report.split("SUMMARY", 1)[-1]
    for phase in PHASES:  # each phase ran (none skipped for want of something to test)
        assert f"✅ {phase.capitalize()}" in summary, report[-4000:]
    assert "failed" not in summary and "passed" in summary, summary
