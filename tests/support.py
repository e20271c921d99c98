"""Shared by tests and benchmarks: throwaway PostgreSQL databases, free ports, `swarm-api`
processes that are waited for until they answer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pydantic_core

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


async def drop_db(name: str, timeout: float = 30.0, server: str = PG_URL) -> None:
    """Drop a database, waiting out a server that is restarting (a test may restart it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', server)
            return
        except (OSError, asyncpg.PostgresError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


@contextlib.contextmanager
def throwaway_db(prefix: str = "swarm_tmp", server: str = PG_URL,
                 migrate: bool = True, template: str | None = None) -> Iterator[str]:
    """A new PostgreSQL database (on `server`), migrated by this checkout unless `migrate` is
    false (the benchmarks leave it to the build they start, which may have other
    migrations), dropped afterwards (connections and all). A `template` (a migrated database
    nobody connects to) is copied instead of migrating: the same tables without the seconds
    of the migrations. It runs its own event loop: use it from synchronous code or a sync
    fixture."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    try:
        asyncio.run(pg_admin(f'CREATE DATABASE "{name}"{copy}', server))
    except (OSError, asyncpg.PostgresError) as exc:
        raise RuntimeError(f"PostgreSQL is not reachable at {server} ({exc!r})") from exc
    url = with_db(server, name)
    try:
        if migrate and not template:
            upgrade_head(url)
        yield url
    finally:
        asyncio.run(drop_db(name, server=server))


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
            log: Path, cli: str = CLI, ready_s: float = 30
            ) -> Iterator[subprocess.Popen[bytes]]:
    """Run `swarm-api <args>` (or another build's `cli`) until the block ends (SIGTERM, then
    SIGKILL)."""
    with log.open("w") as out:
        proc = subprocess.Popen([cli, *args], env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, cwd=log.parent)
        try:
            wait_http(ready_url, ready_s)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


# ---- a PostgreSQL server of our own (for tests that stop or restart the server) -------------

PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))


class PrivatePostgres:
    """A throwaway PostgreSQL cluster (initdb in a temporary directory, its own port, no
    fsync) that a test may stop, restart and start again without touching the shared server
    other tests and other checkouts use. As root, the server runs as the `postgres` user."""

    def __init__(self, *settings: str) -> None:
        """`settings`: `name=value` pairs over the defaults below (the last one given wins)."""
        self.bin = PG_BIN[-1].parent
        self.settings = settings
        self.data = Path(tempfile.mkdtemp(prefix="swarm-pg-"))
        self.port = free_port()
        self.url = f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"
        self._as_owner: list[str] = []
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            shutil.chown(self.data, "postgres", "postgres")
            self._as_owner = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self._as_owner, str(self.bin / tool), *args], check=True,
                       capture_output=True, timeout=60)

    def ctl(self, action: str) -> None:
        """`pg_ctl start|stop|restart`, waiting until it is done (stop: fast, no checkpoint)."""
        options = (f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
                   + "".join(f" -c {setting}" for setting in self.settings))
        args = ["-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "-t", "60"]
        if action in ("start", "restart"):
            args += ["-o", options]
        if action in ("stop", "restart"):
            args += ["-m", "fast"]
        self._run("pg_ctl", action, *args)

    def crash(self) -> None:
        """Stop as a crash would: no shutdown checkpoint, and WAL not yet written is lost."""
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")

    def close(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            self.crash()
        shutil.rmtree(self.data, ignore_errors=True)


@contextlib.contextmanager
def private_postgres(*settings: str) -> Iterator[PrivatePostgres]:
    """A running `PrivatePostgres` (with `settings`), removed afterwards."""
    server = PrivatePostgres(*settings)
    try:
        server.ctl("start")
        yield server
    finally:
        server.close()


def _literal(value: str | list[str]) -> str:
    if isinstance(value, list):
        return f"ARRAY[{', '.join(map(_literal, value))}]::varchar[]"
    return "'" + value.replace("'", "''") + "'"


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """An EXPLAIN (FORMAT JSON) plan's nodes, depth first."""
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


async def kept_plan(conn: asyncpg.Connection, sql: str, args: Sequence[str | list[str]]
                    ) -> list[dict[str, Any]]:
    """The plan PostgreSQL keeps for a statement once prepared, as its nodes (asyncpg prepares
    every statement; after five runs the server plans it once for any arguments and keeps
    that plan until the tables' statistics change, which they never do where autovacuum is
    off). `args`: strings and lists of strings, sent as literals."""
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    await conn.execute(f"PREPARE kept AS {sql}")
    try:
        raw = await conn.fetchval(
            f"EXPLAIN (FORMAT JSON) EXECUTE kept({', '.join(map(_literal, args))})")
    finally:
        await conn.execute("DEALLOCATE kept")
        await conn.execute("RESET plan_cache_mode")
    return list(plan_nodes(pydantic_core.from_json(raw)[0]["Plan"]))


# ---- a process's memory (Linux) -------------------------------------------------------------


def memory(pid: int) -> tuple[int, int]:
    """(resident, peak resident) bytes of a process: VmRSS and VmHWM."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)
    return (int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024)


def reset_peak(pid: int) -> None:
    """Start a process's peak (VmHWM) again from its resident size now."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
