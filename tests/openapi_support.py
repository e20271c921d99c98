"""The OpenAPI document for its tests: SPEC §3's routes and the statuses each must document, the
document as the service serves it, and its schemas checked by jsonschema (Draft 2020-12, the
dialect of OpenAPI 3.1) with every described object closed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import ValidationError

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


async def document(client: httpx.AsyncClient) -> dict[str, Any]:
    """The document as the service serves it."""
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    return doc


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
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
