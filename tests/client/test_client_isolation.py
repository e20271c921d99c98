"""The client and the CLI's client commands run without the service's server-side
dependencies: a fresh interpreter in which every module of FastAPI, SQLAlchemy, uvicorn, … is
blocked imports the client, runs its methods (MockTransport) and `swarm-api ls`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata

from packaging.requirements import Requirement

from tests.support import free_port

# what swarm_api_client needs (README: httpx, httpx-sse, pydantic, tenacity; rich for the CLI)
CLIENT_DEPS = ("httpx", "httpx-sse", "pydantic", "tenacity", "rich")

SCRIPT = r"""
import importlib.abc, json, sys
BLOCKED = frozenset(json.loads(sys.argv[1]))
before = set(sys.modules)

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is blocked in this test", name=name)
        return None

sys.meta_path.insert(0, Block())
import httpx
from swarm_api_client import AsyncSwarmClient, NotFound, SwarmClient

SWARM = {"id": "s1", "status": "succeeded", "created_at": "2026-11-30T12:00:00Z",
         "started_at": None, "finished_at": None, "task": "t", "metadata": {}, "spec": {},
         "progress": {"total": 0}, "subtasks": [],
         "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": "0",
                   "gateway_calls": 0},
         "timing": {"wall_s": None, "critical_path_s": 0, "serial_s": 0, "speedup": None,
                    "subtask_latency_s": {"p50": None, "p95": None, "p99": None}},
         "queue_position": None, "result": "done", "error": None}

def handler(request):
    if request.url.path.endswith("/events"):
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=b'id: 1\nevent: swarm.completed\ndata: {"status": "x"}\n\n')
    if request.url.path == "/swarms/missing":
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no",
                                                   "details": None}})
    return httpx.Response(202, json=SWARM)

with SwarmClient("http://t", transport=httpx.MockTransport(handler)) as c:
    assert c.wait(c.create({"task": "t"}).id).result == "done"
    assert [e.event for e in c.events("s1")] == ["swarm.completed"]
    try:
        c.get("missing")
    except NotFound as exc:
        assert exc.code == "not_found"
    else:
        raise AssertionError("no NotFound")

import app.cli
status = app.cli.main(["ls", "--url", sys.argv[2]])
print(json.dumps({"exit": status, "modules": sorted(set(sys.modules) - before)}))
"""


def _top_levels() -> dict[str, set[str]]:
    """distribution name (normalised) -> its top-level import names."""
    tops: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            tops.setdefault(_norm(dist), set()).add(module)
    return tops


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(names: list[str]) -> set[str]:
    """These distributions and everything they require (without extras)."""
    seen: set[str] = set()
    todo = [_norm(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for raw in metadata.requires(name) or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_norm(req.name))
    return seen


def _in_test_extra(req: Requirement) -> bool:
    return req.marker is not None and req.marker.evaluate({"extra": "test"})


def test_client_and_cli_need_no_server_dependencies() -> None:
    service = [Requirement(r).name for r in metadata.requires("swarm-api") or []
               if Requirement(r).marker is None]
    # the test extra is absent where only the client is installed (selenium's trio, which
    # httpcore imports when it can, would otherwise pull attrs into this interpreter); the
    # bench extra is installed by `make bench` alone, so it is not read here
    extras = [Requirement(r).name for r in metadata.requires("swarm-api") or []
              if _in_test_extra(Requirement(r))]
    client = _closure(list(CLIENT_DEPS))
    assert set(map(_norm, CLIENT_DEPS)) <= set(map(_norm, service)), "client deps are core deps"
    tops = _top_levels()
    server_only = (_closure(service) | _closure(extras)) - client
    blocked = sorted({m for d in server_only for m in tops.get(d, ())})
    assert {"fastapi", "sqlalchemy", "uvicorn", "starlette", "pydantic_settings"} <= set(blocked)

    url = f"http://127.0.0.1:{free_port()}"
    run = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(blocked), url],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.splitlines()[-1])
    assert report["exit"] == 3 and "cannot reach the Swarm API" in run.stderr

    allowed = {m for d in client for m in tops.get(d, ())} | {"app", "swarm_api_client"}
    third_party = {m.partition(".")[0] for m in report["modules"]
                   if not m.startswith("_sysconfigdata")} - set(sys.stdlib_module_names)
    assert third_party - allowed == set(), "only the client's declared deps are imported"
    # of the server, only its pydantic schemas (the estimate's answer has a module of its own)
    assert {m for m in report["modules"] if m.startswith("app.")} == {
        "app.cli", "app.schemas", "app.estimate_schemas", *(f"app.schemas.{m}" for m in (
            "fields", "requests", "responses", "reports"))}
