"""Run Alembic from code: `swarm-api migrate`, the lifespan of serve/worker, and the tests."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncEngine

# the scripts beside the source; an installed package is told where they are (Settings)
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(database_url: str, migrations_dir: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", migrations_dir or str(MIGRATIONS_DIR))
    # ConfigParser interpolation would eat the % of url-encoded passwords
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade_head(database_url: str, migrations_dir: str | None = None) -> None:
    """`alembic upgrade head` on this database (blocking; runs its own event loop)."""
    command.upgrade(alembic_config(database_url, migrations_dir), "head")


async def upgrade_head_async(database_url: str, migrations_dir: str | None = None) -> None:
    # env.py calls asyncio.run, which cannot nest inside a running loop: use a thread
    await asyncio.to_thread(upgrade_head, database_url, migrations_dir)


def head_revision(migrations_dir: str | None = None) -> str | None:
    config = alembic_config("sqlite://", migrations_dir)
    return ScriptDirectory.from_config(config).get_current_head()


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda sync: MigrationContext.configure(sync).get_current_revision()
        )
