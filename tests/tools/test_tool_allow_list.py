"""A tenant uses only the tool servers and tools its `tools` key lists (SPEC §8, §9): others are
422 `unknown_tool` naming the field at creation, through the facade and on retry; `GET /tools`
lists only what it may use; a tenant without the key uses every server. Real MCP server
processes, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import make_settings, start_harness
from tests.mcp_servers import HttpServer, write_config

KEYS = "limited:key-l,open:key-o,nothing:key-n"
TENANTS = """
[tenants.limited]
tools = ["docs.lookup", "web"]

[tenants.nothing]
tools = []
"""


@pytest.fixture(scope="module")
def http_mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path_factory.mktemp("mcp") / "http.log")
    yield server
    server.close()


def _files(tmp_path: Path, http_mcp: HttpServer, tenants: str) -> dict[str, str]:
    (tmp_path / "tenants.toml").write_text(tenants)
    # one HTTP process under three names; "secret" stands for a server with credentials
    config = write_config(tmp_path / "mcp.json", {
        name: {"url": http_mcp.url, "max_concurrency": 4} for name in ("docs", "web", "secret")})
    return {"mcp_config": config, "tenants_file": str(tmp_path / "tenants.toml")}


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _swarm(**kw: Any) -> dict[str, Any]:
    return {"task": "t", "synthesis": {"strategy": "none"}, **kw}


def _agent(*tools: str) -> dict[str, Any]:
    return {"name": "a", "prompt": "look [[sim latency_ms=0]]", "tools": list(tools)}


REFUSED = [  # (tenant key, body, field)
    ("key-l", _swarm(agents=[_agent("docs")]), "agents.0.tools.0"),  # the whole server
    ("key-l", _swarm(agents=[_agent("docs.lookup", "docs.read_file")]), "agents.0.tools.1"),
    ("key-l", _swarm(agents=[_agent("secret")]), "agents.0.tools.0"),
    ("key-l", _swarm(agents=[_agent("secret.lookup")]), "agents.0.tools.0"),
    ("key-l", _swarm(tools=["web", "secret"]), "tools.1"),
    ("key-n", _swarm(agents=[_agent("docs.lookup")]), "agents.0.tools.0"),
]


async def test_a_tenant_uses_only_the_tools_it_lists(database_url: str, tmp_path: Path,
                                                     http_mcp: HttpServer) -> None:
    settings = make_settings(database_url, api_keys=KEYS,
                             **_files(tmp_path, http_mcp, TENANTS))
    h, close = await start_harness(settings)
    try:
        c = h.client
        for key, body, field in REFUSED:
            r = await c.post("/swarms", json=body, headers=_as(key))
            assert r.status_code == 422, (key, body, r.text)
            err = r.json()["error"]
            assert (err["code"], err["details"]["field"]) == ("unknown_tool", field), err
        # through the facade too, in its own error shape and field name
        r = await c.post("/v1/chat/completions", headers=_as("key-l"), json={
            "model": "kimi-k2.5", "messages": [{"role": "user", "content": "hi"}],
            "agent_swarm": {"enabled": True, "tools": ["secret"]}})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "unknown_tool"
        assert r.json()["error"]["param"] == "agent_swarm.tools.0"
        for key in ("key-l", "key-n"):  # nothing was stored
            assert (await c.get("/swarms", headers=_as(key))).json()["items"] == []

        # what it lists runs; another tenant without the key uses every server
        for key, tools in (("key-l", ["docs.lookup", "web.lookup"]), ("key-o", ["secret"])):
            r = await c.post("/swarms", json=_swarm(agents=[_agent(*tools)]), headers=_as(key))
            assert r.status_code == 202, r.text
            done = await _wait(c, r.json()["id"], key)
            assert done["status"] == "succeeded", done["error"]
            assert done["subtasks"][0]["tool_calls"] >= len(tools)

        listed = {key: {(t["server"], t["name"]) for t in
                        (await c.get("/tools", headers=_as(key))).json()["items"]}
                  for key in ("key-l", "key-o", "key-n")}
        assert listed["key-n"] == set()
        assert listed["key-l"] == {("docs", "lookup")} | {
            ("web", t) for t in ("fail", "lookup", "read_file", "sleep")}
        assert {s for s, _ in listed["key-o"]} == {"docs", "web", "secret"}
    finally:
        await close()


async def test_a_retry_is_held_to_the_tools_listed_now(database_url: str, tmp_path: Path,
                                                       http_mcp: HttpServer) -> None:
    files = _files(tmp_path, http_mcp, TENANTS)
    h, close = await start_harness(make_settings(database_url, api_keys=KEYS, **files))
    try:
        body = _swarm(agents=[_agent("docs.lookup"),
                              {"name": "b", "system_prompt": "[[sim fail=400]]"}])
        r = await h.client.post("/swarms", json=body, headers=_as("key-l"))
        assert r.status_code == 202, r.text
        failed = await _wait(h.client, r.json()["id"], "key-l")
        assert failed["status"] == "failed"
    finally:
        await close()
    await h.release_db()
    # the operator takes `docs` away from the tenant: its retry is refused, nothing stored
    files = _files(tmp_path, http_mcp, '[tenants.limited]\ntools = ["web"]\n')
    h, close = await start_harness(make_settings(database_url, api_keys=KEYS, **files))
    try:
        r = await h.client.post(f"/swarms/{failed['id']}/retry", headers=_as("key-l"))
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert (err["code"], err["details"]["field"]) == ("unknown_tool", "agents.0.tools.0")
        items = (await h.client.get("/swarms", headers=_as("key-l"))).json()["items"]
        assert [s["id"] for s in items] == [failed["id"]]
    finally:
        await close()
    await h.release_db()


async def _wait(c: httpx.AsyncClient, swarm_id: str, key: str) -> dict[str, Any]:
    for _ in range(6):
        data: dict[str, Any] = (await c.get(f"/swarms/{swarm_id}", params={"wait": 10},
                                            headers=_as(key))).json()
        if data["status"] in ("succeeded", "failed", "cancelled"):
            return data
    raise AssertionError(f"swarm {swarm_id} not terminal")
