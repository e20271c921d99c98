"""Run Alembic from code: `swarm-api migrate`, the lifespan of serve/worker, and the tests."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, text
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


@functools.cache  # the scripts do not change under a running process; /readyz asks each probe
def head_revision(migrations_dir: str | None = None) -> str | None:
    config = alembic_config("sqlite://", migrations_dir)
    return ScriptDirectory.from_config(config).get_current_head()


async def current_revision(engine: AsyncEngine) -> str | None:
    """The database's revision (None before its first migration; several heads, joined, are
    never the head), after a `SELECT 1` that raises when it does not answer (the readiness
    probe's two questions). Read from alembic's table here: alembic's MigrationContext logs
    two INFO lines each time it is made, which was two lines a readiness probe."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))
        return await conn.run_sync(_revision)


def _revision(conn: Connection) -> str | None:
    if not inspect(conn).has_table("alembic_version"):
        return None
    heads = sorted(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())
    return ",".join(heads) or None
