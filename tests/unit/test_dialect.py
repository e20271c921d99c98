"""The dialect seam: a URL, an engine, a session factory and its sessions all name the same
capabilities; the embedded database migrates itself, a shared one only when asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.db.dialect import (
    POSTGRESQL,
    SQLITE,
    change_listener,
    dialect_of,
    migrates_on_start,
    notify_sender,
)
from app.db.session import make_db_engine, make_session_factory

PG = "postgresql+asyncpg://u@localhost:5432/db"


@pytest.mark.parametrize(("url", "dialect"), [
    (PG, POSTGRESQL), ("sqlite+aiosqlite:///./swarm.db", SQLITE)])
async def test_every_handle_on_a_database_names_its_dialect(url: str, dialect: object) -> None:
    engine = make_db_engine(url)
    try:
        sessions = make_session_factory(engine)
        async with sessions() as session:
            assert dialect_of(url) is dialect_of(engine) is dialect_of(sessions) \
                is dialect_of(session) is dialect
    finally:
        await engine.dispose()


def test_only_a_shared_database_listens_and_sends(tmp_path: Path) -> None:
    lite = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    assert change_listener(lite, {}) is None and notify_sender(lite, "c") is None
    assert change_listener(PG, {}) is not None and notify_sender(PG, "c") is not None


@pytest.mark.parametrize(("url", "asked", "migrates"), [
    (PG, False, False), (PG, True, True), ("sqlite+aiosqlite:///x.db", False, True)])
def test_the_embedded_database_migrates_on_start(url: str, asked: bool, migrates: bool) -> None:
    assert migrates_on_start(url, asked) is migrates
