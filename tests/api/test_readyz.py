"""`/readyz` says ready or not to anyone; the tool servers' names and the versions (schema,
price table, tenants file) only to a caller with a valid key, or with auth off — and the price
table's version stays in `/metrics`. On SQLite and PostgreSQL, with a real MCP server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.conftest import Harness, make_settings, start_harness
from tests.mcp_servers import HttpServer, write_config

SERVER = "crm-with-credentials"
GOOD = {"Authorization": "Bearer key-a"}
ANONYMOUS = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic a2V5LWE="}]


@pytest.fixture(scope="module")
def http_mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path_factory.mktemp("mcp") / "http.log")
    yield server
    server.close()


@pytest.fixture
async def authed(database_url: str, tmp_path: Path, http_mcp: HttpServer
                 ) -> AsyncIterator[Harness]:
    config = write_config(tmp_path / "mcp.json", {SERVER: {"url": http_mcp.url}})
    (tmp_path / "tenants.toml").write_text('[tenants.a]\nmax_streams = 5\n')
    h, close = await start_harness(make_settings(
        database_url, api_keys="a:key-a", mcp_config=config,
        tenants_file=str(tmp_path / "tenants.toml")), run_engine=False)
    yield h
    await close()


async def test_without_a_valid_key_readyz_says_only_ready(authed: Harness) -> None:
    for headers in ANONYMOUS:
        r = await authed.client.get("/readyz", headers=headers)
        assert r.status_code == 200, r.text
        assert r.json() == {"status": "ok"}, headers
        assert SERVER not in r.text
    r = await authed.client.get("/readyz", headers=GOOD)
    assert r.status_code == 200
    ready = r.json()
    assert ready["tool_servers"] == {SERVER: "up"} and ready["database"] == "ok"
    assert ready["revision"] and ready["price_table_version"] and ready["tenants_version"]
    metrics = (await authed.client.get("/metrics")).text  # the version is telemetry too
    assert f'swarm_price_table_info{{version="{ready["price_table_version"]}"}}' in metrics


async def test_not_ready_names_no_revision_without_a_valid_key(authed: Harness) -> None:
    engine = authed.app.state.db_engine
    async with engine.begin() as conn:
        (head,) = (await conn.execute(text("SELECT version_num FROM alembic_version"))).one()
        await conn.execute(text("UPDATE alembic_version SET version_num = 'zz_older'"))
    try:
        for headers in ANONYMOUS:
            r = await authed.client.get("/readyz", headers=headers)
            assert r.status_code == 503
            assert r.json() == {"error": {"code": "unavailable", "message": "not ready",
                                          "details": None}}, r.text
        r = await authed.client.get("/readyz", headers=GOOD)
        assert r.status_code == 503
        assert r.json()["error"]["details"] == {"revision": "zz_older", "head": head}
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": head})
