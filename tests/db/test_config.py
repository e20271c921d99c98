"""Settings refuse, when built, what would silently mean something else; the database engine
keeps SQL parameters (prompts, outputs) out of its errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from app.config import Settings
from app.db.migrate import MIGRATIONS_DIR
from app.db.session import make_db_engine


def _settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.mark.parametrize(("keys", "why"), [
    (" , ", "names no key"),
    (",", "names no key"),
    ("a:k1,b:k1", "twice"),
    ("a:k1, a:k1", "twice"),
    ("a:k1,oops", "tenant:key"),
    ("a:", "tenant:key"),
    (":k", "tenant:key"),
])
def test_ambiguous_api_keys_are_refused(keys: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        _settings(api_keys=keys)


def test_api_keys_parse() -> None:
    assert _settings(api_keys="").keys.keys == {}
    assert not _settings(api_keys="  ").auth_enabled
    s = _settings(api_keys=" acme : k1 , beta:k2,")
    assert {k.tenant for k in s.keys.keys.values()} == {"acme", "beta"} and s.auth_enabled
    assert s.keys.find("k1").tenant == "acme" and s.keys.find("k2").tenant == "beta"  # type: ignore[union-attr]
    assert s.keys.find("k3") is None


def test_the_environment_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_API_KEYS", " , ")
    with pytest.raises(ValidationError, match="names no key"):
        Settings(_env_file=None)  # type: ignore[call-arg]


def test_the_event_streams_ping_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """15 s by default (below the 30 to 60 s idle timeouts of common proxies); never 0, which
    would mean a stream of pings."""
    assert _settings().sse_ping_s == 15
    monkeypatch.setenv("SWARM_SSE_PING_S", "2.5")
    assert Settings(_env_file=None).sse_ping_s == 2.5  # type: ignore[call-arg]
    for bad in (0, -1, 7200):
        with pytest.raises(ValidationError, match="sse_ping_s"):
            _settings(sse_ping_s=bad)


def test_a_default_model_without_a_price_is_refused() -> None:
    with pytest.raises(ValidationError, match="no price"):
        _settings(default_model="gpt-9000")
    assert _settings(default_model="deepseek-v3.2").default_model == "deepseek-v3.2"


def test_bad_files_are_refused_when_built(tmp_path: Path) -> None:
    models, tenants = tmp_path / "models.toml", tmp_path / "tenants.toml"
    models.write_text("[models.fast]\ninput = \"lots\"\n")
    tenants.write_text("[defaults]\nburst = 0\n")
    with pytest.raises(ValidationError, match=r"models\.toml"):
        _settings(models_file=str(models))
    with pytest.raises(ValidationError, match="burst"):
        _settings(tenants_file=str(tenants))
    with pytest.raises(ValidationError, match=r"nowhere\.toml"):
        _settings(tenants_file=str(tmp_path / "nowhere.toml"))
    mcp = tmp_path / "mcp.json"
    mcp.write_text("{bad")
    with pytest.raises(ValidationError, match=r"SWARM_MCP_CONFIG .*mcp\.json"):
        _settings(mcp_config=str(mcp))
    with pytest.raises(ValidationError, match=r"SWARM_MCP_CONFIG .*nowhere\.json"):
        _settings(mcp_config=str(tmp_path / "nowhere.json"))
    mcp.write_text('{"mcpServers": {"search": {"command": "search-mcp"}}}')
    assert _settings(mcp_config=str(mcp)).mcp_config == str(mcp)  # its servers start later


def test_migrations_dir_and_crash_points_are_settings(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert _settings().migrations_dir is None and _settings().crash_at == ""
    monkeypatch.setenv("SWARM_MIGRATIONS_DIR", str(MIGRATIONS_DIR))
    monkeypatch.setenv("SWARM_CRASH_AT", "before_call:b,after_commit:c")
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert s.migrations_dir == str(MIGRATIONS_DIR)
    assert s.crash_at == "before_call:b,after_commit:c"
    with pytest.raises(ValidationError, match=r"no Alembic env\.py"):
        _settings(migrations_dir=str(tmp_path))
    with pytest.raises(ValidationError, match="<point>:<subtask>"):
        _settings(crash_at="before_call")


@pytest.mark.parametrize(("given", "meant"), [
    ("sqlite+aiosqlite:///./swarm.db", "sqlite+aiosqlite:///./swarm.db"),
    ("sqlite+aiosqlite://", "sqlite+aiosqlite://"),  # in memory
    ("sqlite:///./x.db?mode=rwc", "sqlite+aiosqlite:///./x.db?mode=rwc"),
    ("postgresql+asyncpg://u:p@db:5432/swarm", "postgresql+asyncpg://u:p@db:5432/swarm"),
    ("postgresql://u:p@db/swarm", "postgresql+asyncpg://u:p@db/swarm"),
    ("postgres://u@db/swarm", "postgresql+asyncpg://u@db/swarm"),  # a platform's DATABASE_URL
    (" POSTGRES://u@db/swarm ", "postgresql+asyncpg://u@db/swarm"),
])
def test_database_urls_name_their_async_driver(given: str, meant: str) -> None:
    assert _settings(database_url=given).database_url == meant


@pytest.mark.parametrize(("given", "why"), [
    ("mysql://u:hunter2@db/swarm", "must be postgresql[+]asyncpg://"),
    ("postgresql+psycopg2://u:hunter2@db/swarm", "must be postgresql[+]asyncpg://"),
    ("swarm.db", "must be postgresql[+]asyncpg://"),
    ("", "must be postgresql[+]asyncpg://"),
    ("sqlite+aiosqlite:////nowhere/at/all/swarm.db", "'/nowhere/at/all' does not exist"),
])
def test_a_database_this_service_cannot_open_is_refused_when_built(given: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        _settings(database_url=given)


@pytest.mark.parametrize("given", ["notaurl", "gateway.example/v1", "ftp://gw/v1", "http://",
                                   "https:///v1"])
def test_a_gateway_url_is_an_http_base_url(given: str) -> None:
    with pytest.raises(ValidationError, match=r"must be an http\(s\) base URL"):
        _settings(gateway_url=given)
    assert _settings(gateway_url=" https://gw.example:8443/v1/ ").gateway_url == \
        "https://gw.example:8443/v1"
    assert _settings(gateway_url="").gateway_url is None


async def test_statement_errors_do_not_carry_their_parameters(tmp_path: Any) -> None:
    engine = make_db_engine(f"sqlite+aiosqlite:///{tmp_path}/x.db")
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE t (x TEXT NOT NULL UNIQUE)"))
            await conn.execute(text("INSERT INTO t VALUES (:x)"), {"x": "secret prompt"})
            with pytest.raises(Exception) as caught:
                await conn.execute(text("INSERT INTO t VALUES (:x)"), {"x": "secret prompt"})
        assert "UNIQUE" in str(caught.value)
        assert "secret prompt" not in str(caught.value)
    finally:
        await engine.dispose()
