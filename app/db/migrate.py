"""Run Alembic from code: `swarm-api migrate`, the lifespan of serve/worker, and the tests."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS_DIR = Path(
    os.environ.get("SWARM_MIGRATIONS_DIR", Path(__file__).resolve().parents[2] / "migrations")
)


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would eat the % of url-encoded passwords
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade_head(database_url: str) -> None:
    """`alembic upgrade head` on this database (blocking; runs its own event loop)."""
    command.upgrade(alembic_config(database_url), "head")


async def upgrade_head_async(database_url: str) -> None:
    # env.py calls asyncio.run, which cannot nest inside a running loop: use a thread
    await asyncio.to_thread(upgrade_head, database_url)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda sync: MigrationContext.configure(sync).get_current_revision()
        )
