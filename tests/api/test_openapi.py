"""The OpenAPI document is complete: every SPEC §3 route, every status it answers with its
schema, its examples, parameters and keys; and the checker real answers are held to
(tests/openapi_support.py; the answers themselves: test_openapi_answers) can fail."""

from __future__ import annotations

import re
from typing import Any

from tests.conftest import Harness, make_settings, start_harness
from tests.openapi_support import SPEC_ROUTES, document, resolve, schema_errors

ERROR_REF = "#/components/schemas/ErrorResponse"
OPENAI_ERROR_REF = "#/components/schemas/OpenAIError"  # the /v1 facade speaks OpenAI's shape


def test_validator_rejects_what_it_should() -> None:
    """The checker can fail (so the truthfulness test of test_openapi_answers means something)."""
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


async def test_every_spec_route_and_status_is_documented(api: Harness) -> None:
    doc = await document(api.client)
    for (method, path), statuses in SPEC_ROUTES.items():
        assert path in doc["paths"], path
        op = doc["paths"][path].get(method)
        assert op is not None, (method, path)
        documented = {int(s) for s in op["responses"]}
        assert statuses <= documented, (method, path, statuses - documented)
        assert op.get("summary"), (method, path)


async def test_every_error_response_uses_the_error_schema(api: Harness) -> None:
    doc = await document(api.client)
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
    body = resolve(doc, error["properties"]["error"])
    assert set(body["properties"]) == {"code", "message", "details"}
    assert set(body["required"]) >= {"code", "message"}


async def test_create_documents_its_request_with_an_example(api: Harness) -> None:
    doc = await document(api.client)
    op = doc["paths"]["/swarms"]["post"]
    media = op["requestBody"]["content"]["application/json"]
    schema = resolve(doc, media["schema"])
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
    doc = await document(api.client)

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
    status = resolve(doc, bounds(param("/swarms", "status")["schema"]))
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
    doc = await document(api.client)

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
        doc = await document(h.client)
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
    doc = await document(api.client)
    assert "securitySchemes" not in doc.get("components", {})
    assert not [(m, p) for p, ops in doc["paths"].items() for m, op in ops.items()
                if "security" in op]


async def test_docs_page_is_served(api: Harness) -> None:
    r = await api.client.get("/docs")
    assert r.status_code == 200 and "swagger" in r.text.lower()
