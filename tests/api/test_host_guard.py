"""SPEC §17, DNS rebinding: an API without keys answers requests addressed to a loopback name
or address, the host it is bound to, or one of SWARM_ALLOWED_HOSTS; a web page whose name an
attacker rebinds to 127.0.0.1 (its requests come from a loopback client, with its own name as
Host) is refused with 403 before anything is stored or spent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from app.middleware import host_name
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import error_of, stored_swarms
from tests.support import free_port, process

REBIND = "rebind.attacker.example"
BODY = {"task": "t", "agents": [{"name": "a"}]}
LOOPBACK_HOSTS = ["localhost", "localhost:8000", "LocalHost.", "127.0.0.1", "127.0.0.1:8000",
                  "127.8.9.1:80", "[::1]", "[::1]:8000"]


def _client(h: Harness, base_url: str = "http://127.0.0.1:8000") -> httpx.AsyncClient:
    """A loopback client of the app; the ASGI server it reaches is `base_url`'s host."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=h.app), base_url=base_url)


@pytest.fixture
async def open_api(sqlite_url: str) -> AsyncIterator[Harness]:
    h, close = await start_harness(make_settings(sqlite_url))
    yield h
    await close()


async def test_a_rebound_name_is_refused_and_nothing_runs(open_api: Harness) -> None:
    async with _client(open_api) as c:
        headers = {"Host": REBIND}
        err = error_of(await c.post("/swarms", json=BODY, headers=headers), 403, "forbidden")
        assert err["details"] == {"host": REBIND}
        assert "SWARM_ALLOWED_HOSTS" in err["message"]
        error_of(await c.get("/swarms", headers=headers), 403, "forbidden")
        error_of(await c.get("/ui", headers=headers), 403, "forbidden")
        error_of(await c.get("/docs", headers=headers), 403, "forbidden")
        # the facade answers in OpenAI's error shape
        r = await c.post("/v1/chat/completions", headers=headers, json={
            "model": "kimi-k2.5", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text
        # the same page's name with a loopback-looking prefix or a port is no loopback name
        for host in (f"{REBIND}:8000", "127.0.0.1.nip.io", "localhost.attacker.example",
                     "localhost:evil", "[::1]x", "127.1"):
            r = await c.post("/swarms", json=BODY, headers={"Host": host})
            error_of(r, 403, "forbidden")
        # the probes stay reachable, as they do for a remote client
        assert (await c.get("/healthz", headers=headers)).status_code == 200
    assert await stored_swarms(open_api) == 0
    assert open_api.sim_stats.calls == 0


@pytest.mark.parametrize("host", LOOPBACK_HOSTS)
async def test_loopback_hosts_are_served(open_api: Harness, host: str) -> None:
    async with _client(open_api) as c:
        r = await c.post("/swarms", json=BODY, headers={"Host": host})
        assert r.status_code == 202, (host, r.text)
        assert (await c.get("/ui", headers={"Host": host})).status_code == 200
        assert (await c.get("/docs", headers={"Host": host})).status_code == 200


async def test_the_bound_host_is_served(open_api: Harness) -> None:
    # the ASGI server says which host the request reached: a name it is bound to answers
    async with _client(open_api, "http://swarm.internal:8000") as c:
        assert (await c.get("/swarms")).status_code == 200  # Host: swarm.internal:8000
        error_of(await c.get("/swarms", headers={"Host": REBIND}), 403, "forbidden")


async def test_allowed_hosts_are_served(sqlite_url: str) -> None:
    settings = make_settings(sqlite_url, allowed_hosts="swarm.lan, [FD00::1],Api.Example.")
    h, close = await start_harness(settings, run_engine=False)
    try:
        async with _client(h) as c:
            for host in ("swarm.lan", "SWARM.LAN:8443", "[fd00::1]:80", "api.example"):
                assert (await c.get("/swarms", headers={"Host": host})).status_code == 200, host
            error_of(await c.get("/swarms", headers={"Host": REBIND}), 403, "forbidden")
            error_of(await c.get("/swarms", headers={"Host": "evil.swarm.lan"}), 403)
    finally:
        await close()


@pytest.mark.parametrize("overrides,headers", [
    ({"api_keys": "t:k"}, {"Authorization": "Bearer k"}),
    ({"allow_open": True}, {}),
])
async def test_with_keys_or_allow_open_any_host_is_served(
        sqlite_url: str, overrides: dict[str, Any], headers: dict[str, str]) -> None:
    h, close = await start_harness(make_settings(sqlite_url, **overrides))
    try:
        async with _client(h) as c:
            r = await c.post("/swarms", json=BODY, headers={**headers, "Host": REBIND})
            assert r.status_code == 202, r.text
    finally:
        await close()


@pytest.mark.parametrize("value", ["http://swarm.lan", "swarm.lan:8000", "a b", "user@host",
                                   "."])
def test_allowed_hosts_are_names(value: str) -> None:
    with pytest.raises(ValidationError, match="SWARM_ALLOWED_HOSTS"):
        make_settings("sqlite+aiosqlite:///x.db", allowed_hosts=value)


@pytest.mark.parametrize("header,name", [
    ("LocalHost:8000", "localhost"), ("localhost.", "localhost"), ("[::1]:80", "::1"),
    ("::1", "::1"), ("127.0.0.1", "127.0.0.1"), ("x:y", None), ("[::1", None),
    ("[::1]8000", None),
])
def test_host_name_of_a_header(header: str, name: str | None) -> None:
    assert host_name(header) == name


async def test_make_run_serves_the_ui_and_docs_on_loopback(tmp_path: Path) -> None:
    """`swarm-api serve` as `make run` starts it (no keys, 127.0.0.1): the UI and /docs answer
    at http://127.0.0.1:PORT and http://localhost:PORT; a rebound name does not."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"SWARM_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'run.db'}",
           "SWARM_API_KEYS": "", "SWARM_ALLOW_OPEN": "0", "SWARM_ALLOWED_HOSTS": ""}
    with process(["serve", "--host", "127.0.0.1", "--port", str(port)], env,
                 f"{url}/healthz", tmp_path / "serve.log", ready_s=90):
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
                for path in ("/ui", "/docs", "/openapi.json", "/swarms"):
                    r = await c.get(path, headers={"Host": host})
                    assert r.status_code == 200, (host, path, r.text)
            r = await c.post("/swarms", json=BODY, headers={"Host": f"{REBIND}:{port}"})
            error_of(r, 403, "forbidden")
            r = await c.post("/swarms", json=BODY, headers={"Host": f"localhost:{port}"})
            assert r.status_code == 202, r.text
            listed = await c.get("/swarms")
            assert [s["id"] for s in listed.json()["items"]] == [r.json()["id"]]
