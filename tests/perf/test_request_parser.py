"""`POST /swarms` parses its own request (app/api/request_parser.py): every request answers what
FastAPI's own parsing of `create_swarm`'s signature answers. Each case goes to the service's
route and to a twin app whose plain `APIRoute` runs the same endpoint on the same state."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from app.api import errors
from app.api.swarms import create_swarm
from app.middleware import BodyLimit
from tests.conftest import make_settings, start_harness
from tests.validation_cases import REJECTED

TENANTS = """
[defaults]
max_budget_usd = "2"

[tenants.b]
max_agents = 1
"""
A = {"Authorization": "Bearer ka"}
B = {"Authorization": "Bearer kb"}
JSON = {"content-type": "application/json"}
OK: dict[str, Any] = {"task": "t", "agents": [{"name": "a"}], "synthesis": {"strategy": "none"}}
BAD: dict[str, Any] = {"task": "", "agents": []}
_VOLATILE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # ids
    r"|\d{4}-\d\d-\d\dT[0-9:.]+(Z|[+-]\d\d:\d\d)?")  # times


class Pair:
    def __init__(self, ours: httpx.AsyncClient, twin: httpx.AsyncClient) -> None:
        self.ours, self.twin = ours, twin

    async def both(self, content: bytes, headers: dict[str, str]) -> tuple[Any, Any]:
        answers = [await c.post("/swarms", content=content, headers=headers)
                   for c in (self.ours, self.twin)]
        return tuple(_seen(r) for r in answers)


def _seen(r: httpx.Response) -> tuple[Any, ...]:
    """What a client sees, with ids and times (which differ between two creations) masked."""
    body = json.loads(_VOLATILE.sub("<v>", r.text))
    if isinstance(body, dict):
        body.pop("queue_position", None)  # one more queued swarm each time
    return (r.status_code, r.headers.get("content-type"), r.headers.get("www-authenticate"),
            _VOLATILE.sub("<v>", r.headers.get("location", "")), body)


@pytest.fixture
async def pair(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Pair]:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    h, close = await start_harness(
        make_settings(sqlite_url, api_keys="a:ka,b:kb", tenants_file=str(tenants),
                      max_agents=3),
        run_engine=False)
    twin = FastAPI()
    errors.install(twin)
    # the app's own body checks in front of both (a body that is not JSON: 415 there)
    twin.add_middleware(BodyLimit, limit=h.app.state.settings.max_body_bytes)
    twin.state = h.app.state
    twin.router.routes.append(APIRoute("/swarms", create_swarm, methods=["POST"],
                                       status_code=202))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=twin),
                                 base_url="http://api") as other:
        yield Pair(h.client, other)
    await close()


def _assert_same(ours: Any, twin: Any) -> None:
    assert ours == twin
    assert ours[0] != 500


@pytest.mark.parametrize(("body", "status"), [pytest.param(c[1], c[2], id=c[0])
                                              for c in REJECTED])
async def test_every_rejected_body_answers_as_fastapi_does(pair: Pair, body: Any,
                                                           status: int) -> None:
    ours, twin = await pair.both(json.dumps(body).encode(), {**A, **JSON})
    _assert_same(ours, twin)
    assert ours[0] == status


RAW: list[tuple[str, bytes, dict[str, str]]] = [
    ("empty", b"", JSON),
    ("empty-no-type", b"", {}),
    ("truncated", b'{"task": "t"', JSON),
    ("not-json", b"task=t", JSON),
    ("not-utf8", b'{"task": "\xff"}', JSON),
    ("nested", b"[" * 100_000 + b"]" * 100_000, JSON),
    ("null", b"null", JSON),
    ("nan", b'{"task": "t", "agents": [{"name": "a"}], "temperature": NaN}', JSON),
    ("no-content-type", json.dumps(OK).encode(), {}),
    ("text-plain", json.dumps(OK).encode(), {"content-type": "text/plain"}),
    ("form", b"task=t", {"content-type": "application/x-www-form-urlencoded"}),
    ("json-charset", json.dumps(OK).encode(), {"content-type": "application/json; charset=utf-8"}),
    ("json-upper", json.dumps(OK).encode(), {"content-type": "APPLICATION/JSON"}),
    ("plus-json", json.dumps(OK).encode(), {"content-type": "application/vnd.swarm+json"}),
    ("json-like", json.dumps(OK).encode(), {"content-type": "application/json-seq"}),
    ("bad-type", json.dumps(OK).encode(), {"content-type": "json"}),
]


@pytest.mark.parametrize(("content", "headers"),
                         [pytest.param(c[1], c[2], id=c[0]) for c in RAW])
async def test_raw_bodies_answer_as_fastapi_does(pair: Pair, content: bytes,
                                                 headers: dict[str, str]) -> None:
    ours, twin = await pair.both(content, {**A, **headers})
    _assert_same(ours, twin)


HEADERS: list[tuple[str, dict[str, Any], dict[str, str], int]] = [
    ("no-auth", BAD, {}, 401),
    ("wrong-key", BAD, {"Authorization": "Bearer nope"}, 401),
    ("basic", OK, {"Authorization": "Basic a2E="}, 401),
    ("key-empty", OK, {**A, "Idempotency-Key": ""}, 422),
    ("key-long", OK, {**A, "Idempotency-Key": "k" * 256}, 422),
    ("key-tab", OK, {**A, "Idempotency-Key": "a\tb"}, 422),
    ("key-and-body", BAD, {**A, "Idempotency-Key": ""}, 422),  # both errors, in order
    ("tenant-quota", {**OK, "agents": [{"name": "a"}, {"name": "b"}]}, B, 429),
    ("budget-quota", {**OK, "limits": {"budget_usd": "3"}}, A, 422),
    ("traceparent", OK, {**A, "traceparent": "00-0af7651916cd43dd8448eb211c80319c-"
                                              "b7ad6b7169203331-01"}, 202),
    ("bad-traceparent", OK, {**A, "traceparent": "nonsense"}, 202),
    ("ok", OK, A, 202),
]


@pytest.mark.parametrize(("body", "headers", "status"),
                         [pytest.param(*c[1:], id=c[0]) for c in HEADERS])
async def test_headers_answer_as_fastapi_does(pair: Pair, body: dict[str, Any],
                                              headers: dict[str, str], status: int) -> None:
    ours, twin = await pair.both(json.dumps(body).encode(), {**JSON, **headers})
    _assert_same(ours, twin)
    assert ours[0] == status


async def test_idempotency_keys_answer_as_fastapi_does(pair: Pair) -> None:
    seen = []
    for client, key in ((pair.ours, "k-ours"), (pair.twin, "k-twin")):
        headers = {**A, "Idempotency-Key": key}
        first = await client.post("/swarms", json=OK, headers=headers)
        again = await client.post("/swarms", json=OK, headers=headers)
        other = await client.post("/swarms", json={**OK, "task": "u"}, headers=headers)
        assert first.json()["id"] == again.json()["id"]
        seen.append([_seen(r) for r in (first, again, other)])
    assert seen[0] == seen[1]
    assert [s[0] for s in seen[0]] == [202, 202, 422]
