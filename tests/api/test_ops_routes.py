"""The ops routes (health, readiness, metrics) answer as SPEC §3 says; what the framework answers
itself (an unknown path or method, HEAD) has the SPEC's error shape."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.conftest import Harness
from tests.helpers import UNKNOWN_ID, error_of


async def test_health_ready_metrics(api: Harness) -> None:
    r = await api.client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = await api.client.get("/readyz")
    assert r.status_code == 200
    ready = r.json()
    assert ready["status"] == "ok" and isinstance(ready["revision"], str) and ready["revision"]
    await api.run({"task": "t", "agents": [{"name": "a"}]})
    r = await api.client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert "swarm_runs_total" in r.text
    assert 'swarm_runs_total{status="succeeded"}' in r.text


@pytest.mark.parametrize(("method", "path", "status", "code"), [
    ("GET", "/nope", 404, "not_found"),
    ("GET", "/swarms/x/y/z", 404, "not_found"),
    ("DELETE", "/swarms", 405, "method_not_allowed"),
    ("PUT", f"/swarms/{UNKNOWN_ID}", 405, "method_not_allowed"),
    ("GET", f"/swarms/{UNKNOWN_ID}/cancel", 405, "method_not_allowed"),
    ("POST", "/healthz", 405, "method_not_allowed"),
])
async def test_framework_errors_have_the_error_shape(api: Harness, method: str, path: str,
                                                     status: int, code: str) -> None:
    error_of(await api.client.request(method, path), status, code)


async def test_a_405_allows_every_method_its_path_serves(api: Harness) -> None:
    """RFC 9110: a 405's `Allow` lists the target's methods. Starlette names the first route
    that matched the path only: `OPTIONS /swarms` answered `Allow: POST` (schemathesis'
    ST205), GET being served there too."""
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    for template, operations in paths.items():
        path = template.replace("{swarm_id}", str(uuid.uuid4())).replace("{name}", "a")
        documented = {m.upper() for m in operations} & {"GET", "POST", "PUT", "PATCH", "DELETE"}
        for method in ("OPTIONS", "PATCH"):
            if method in documented:
                continue
            r = await api.client.request(method, path)
            if template.startswith("/v1/"):  # OpenAI's shape there (tests/facade)
                assert r.status_code == 405
                assert r.json()["error"]["code"] == "method_not_allowed", r.text
            else:
                error_of(r, 405, "method_not_allowed")
            allowed = set(r.headers["allow"].split(", "))
            assert allowed - {"HEAD"} == documented, (method, template, r.headers["allow"])
            # HEAD wherever GET is, but the event stream (which never ends by itself)
            heads = "GET" in documented and not template.endswith("/events")
            assert ("HEAD" in allowed) == heads, (template, r.headers["allow"])


async def test_head_answers_what_get_would_without_the_body(api: Harness) -> None:
    """RFC 9110 §9.3.2 (uptime monitors and `curl -I` send HEAD): the GET's status and
    headers, no body; on the event stream a 405 (its answer would not end)."""
    swarm = await api.run({"task": "t", "agents": [{"name": "a"}]})
    for path in ("/healthz", "/readyz", "/swarms", f"/swarms/{swarm['id']}",
                 f"/swarms/{swarm['id']}/subtasks/a", "/usage", "/openapi.json", "/ui"):
        got, head = await api.client.get(path), await api.client.head(path)
        assert got.status_code == head.status_code == 200, (path, head.status_code)
        assert head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
        if "/swarms" not in path:  # a swarm's answer carries a moving `timing.wall_s`: no
            assert head.headers["content-length"] == got.headers["content-length"], path
    missing = await api.client.head(f"/swarms/{uuid.uuid4()}")
    assert missing.status_code == 404 and missing.content == b""
    stream = await api.client.head(f"/swarms/{swarm['id']}/events")
    assert stream.status_code == 405 and stream.headers["allow"] == "GET"
    cancel = await api.client.head(f"/swarms/{swarm['id']}/cancel")
    assert cancel.status_code == 405 and cancel.headers["allow"] == "POST"
    text = (await api.client.get("/metrics")).text
    assert re.search(r'swarm_http_request_duration_seconds_count\{method="HEAD",'
                     r'route="/swarms/\{swarm_id\}",status="200"\} [1-9]', text), text[-3000:]
