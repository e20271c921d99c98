"""Shared by tests and benchmarks: throwaway PostgreSQL databases, free ports, `swarm-api`
processes that are waited for until they answer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx

from app.db.migrate import upgrade_head
from app.db.session import asyncpg_dsn

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("swarm-api"))
PG_URL = os.environ.get(
    "SWARM_TEST_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")


def with_db(url: str, name: str) -> str:
    """The same server URL with another database name."""
    return url.rsplit("/", 1)[0] + "/" + name


async def pg_admin(sql: str, url: str = PG_URL) -> None:
    """One statement on its own connection (CREATE/DROP DATABASE, TRUNCATE)."""
    conn = await asyncpg.connect(asyncpg_dsn(url), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def drop_db(name: str, timeout: float = 30.0) -> None:
    """Drop a database, waiting out a server that is restarting (a test may restart it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except (OSError, asyncpg.PostgresError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


@contextlib.contextmanager
def throwaway_db(prefix: str = "swarm_tmp") -> Iterator[str]:
    """A new, migrated PostgreSQL database, dropped afterwards (connections and all). It runs
    its own event loop: use it from synchronous code or a sync fixture."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        asyncio.run(pg_admin(f'CREATE DATABASE "{name}"'))
    except (OSError, asyncpg.PostgresError) as exc:
        raise RuntimeError(f"PostgreSQL is not reachable at {PG_URL} ({exc!r})") from exc
    url = with_db(PG_URL, name)
    try:
        upgrade_head(url)
        yield url
    finally:
        asyncio.run(drop_db(name))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code < 500:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {timeout}s")


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str], ready_url: str,
            log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run `swarm-api <args>` until the block ends (SIGTERM, then SIGKILL)."""
    with log.open("w") as out:
        proc = subprocess.Popen([CLI, *args], env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, cwd=log.parent)
        try:
            wait_http(ready_url)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
