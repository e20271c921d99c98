"""Real processes for the integration tests: a throwaway PostgreSQL database, the simulator,
API replicas (`serve --no-engine`) and workers, each a `swarm-api` subprocess.

Every process a `Cluster` starts is SIGKILLed (by its own pid) when the cluster closes, also
when it was stopped with SIGSTOP. Tests wait by polling with a timeout, never by sleeping
blindly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from app.db.session import asyncpg_dsn
from app.pricing import PriceTable
from tests.helpers import until
from tests.support import CLI, free_port, throwaway_db

TERMINAL = ("succeeded", "failed", "cancelled")


# ---- processes -----------------------------------------------------------------------------


class Proc:
    """One `swarm-api` subprocess with its output in a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], workdir: Path) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self._out = self.log_path.open("wb")
        self.popen = subprocess.Popen([CLI, *args], env=env, stdout=self._out,
                                      stderr=subprocess.STDOUT, cwd=workdir)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def send(self, sig: signal.Signals) -> None:
        if self.alive:
            os.kill(self.pid, sig)

    async def wait_log(self, needle: str, timeout: float = 60.0) -> None:
        async def seen() -> bool:
            if needle in self.log():
                return True
            if not self.alive:
                raise AssertionError(f"{self.name} exited ({self.popen.returncode}) before "
                                     f"logging {needle!r}:\n{self.log()[-3000:]}")
            return False

        await until(seen, timeout, f"{self.name} to log {needle!r}")

    async def wait_exit(self, timeout: float) -> int:
        async def exited() -> bool:
            return not self.alive

        await until(exited, timeout, f"{self.name} to exit")
        return int(self.popen.returncode)

    def kill(self) -> None:
        """SIGKILL (works on a stopped process too) and reap."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        self._out.close()


class Cluster:
    """The processes of one test, against one database; `close()` kills whatever is left."""

    def __init__(self, db_url: str, workdir: Path, **env: str) -> None:
        self.db_url = db_url
        self.workdir = workdir
        self.procs: list[Proc] = []
        self.sim_url = ""
        # short leases and polls keep the tests fast; every SWARM_ variable of the outer
        # environment is dropped so that nothing leaks in (a stray SWARM_CRASH_AT, say)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
        self.env.update({
            "PYTHONUNBUFFERED": "1", "SWARM_DATABASE_URL": db_url, "SWARM_AUTO_MIGRATE": "0",
            "SWARM_LEASE_SECONDS": "2", "SWARM_POLL_INTERVAL_S": "0.2",
            "SWARM_SHUTDOWN_GRACE_S": "5",
            "SWARM_LOG_FORMAT": "text",  # what wait_log's needles are written for
        })
        self.env.update(env)

    def spawn(self, name: str, args: list[str], **env: str) -> Proc:
        proc = Proc(name, args, {**self.env, **env}, self.workdir)
        self.procs.append(proc)
        return proc

    async def simulator(self, latency_ms: float = 20, **env: str) -> str:
        """Start the simulator; returns its base URL (…/v1) and points workers at it."""
        port = free_port()
        proc = self.spawn("simulator", ["simulator", "--port", str(port)],
                          SWARM_SIM_LATENCY_MS=str(latency_ms), **env)
        self.sim_url = f"http://127.0.0.1:{port}/v1"
        await wait_http(proc, f"{self.sim_url}/_stats")
        self.env["SWARM_GATEWAY_URL"] = self.sim_url
        return self.sim_url

    async def api(self, name: str = "api", **env: str) -> str:
        """An API replica without an engine; returns its base URL once /readyz answers."""
        port = free_port()
        proc = self.spawn(name, ["serve", "--no-engine", "--port", str(port)], **env)
        url = f"http://127.0.0.1:{port}"
        await wait_http(proc, f"{url}/readyz", ok_only=True)
        return url

    async def worker(self, name: str, **env: str) -> Proc:
        """A worker, returned once its engine runs (a loaded machine may take a while)."""
        proc = self.spawn(name, ["worker"], **env)
        await proc.wait_log(" running", timeout=60)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()

    def logs(self) -> str:
        """The tail of every process' log, for failure messages."""
        return "\n".join(f"----- {p.name} (pid {p.pid})\n{p.log()[-2500:]}" for p in self.procs)


@contextlib.asynccontextmanager
async def cluster(db_url: str, workdir: Path, **env: str) -> AsyncIterator[Cluster]:
    c = Cluster(db_url, workdir, **env)
    try:
        yield c
    except BaseException:
        print(c.logs())  # shown by pytest for a failing test
        raise
    finally:
        c.close()


async def wait_http(proc: Proc, url: str, timeout: float = 60.0, ok_only: bool = False) -> None:
    async with httpx.AsyncClient(timeout=1) as client:
        async def answers() -> bool:
            if not proc.alive:
                raise AssertionError(f"{proc.name} exited:\n{proc.log()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                r = await client.get(url)
                return r.status_code == 200 if ok_only else r.status_code < 500
            return False

        await until(answers, timeout, f"{url} to answer", every=0.1)


# ---- the database, read directly -----------------------------------------------------------


class Db:
    """Plain SQL on a test database (asyncpg), for assertions the API does not expose."""

    def __init__(self, url: str) -> None:
        self.dsn = asyncpg_dsn(url)

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.dsn, timeout=5)
        try:
            for typ in ("json", "jsonb"):
                await conn.set_type_codec(typ, encoder=json.dumps, decoder=json.loads,
                                          schema="pg_catalog")
            rows: list[asyncpg.Record] = await conn.fetch(sql, *args)
            return rows
        finally:
            await conn.close()

    async def swarm(self, swarm_id: str) -> asyncpg.Record:
        rows = await self.fetch("SELECT * FROM swarms WHERE id = $1", swarm_id)
        assert rows, f"no swarm {swarm_id}"
        return rows[0]

    async def subtasks(self, swarm_id: str) -> dict[str, asyncpg.Record]:
        rows = await self.fetch("SELECT * FROM subtasks WHERE swarm_id = $1 ORDER BY position",
                                swarm_id)
        return {r["name"]: r for r in rows}

    async def events(self, swarm_id: str) -> list[asyncpg.Record]:
        return await self.fetch("SELECT seq, type, data FROM events WHERE swarm_id = $1 "
                                "ORDER BY seq", swarm_id)

    async def ledger(self, swarm_id: str) -> list[asyncpg.Record]:
        return await self.fetch("SELECT * FROM gateway_calls WHERE swarm_id = $1 ORDER BY id",
                                swarm_id)

    async def lease_owner(self, swarm_id: str) -> str | None:
        owner: str | None = (await self.swarm(swarm_id))["lease_owner"]
        return owner

    async def listening(self, since: datetime | None = None) -> int:
        """Connections of this database that LISTEN (a worker's or API's wake-up channel),
        opened `since` (database time) if given; their last statement stays a LISTEN until
        the first health check, seconds later."""
        rows = await self.fetch("SELECT count(*) FROM pg_stat_activity "
                                "WHERE datname = current_database() AND query LIKE 'LISTEN%' "
                                "AND backend_start >= coalesce($1::timestamptz, '-infinity')",
                                since)
        return int(rows[0][0])

    async def now(self) -> datetime:
        now: datetime = (await self.fetch("SELECT now()"))[0][0]
        return now

    async def snapshot(self, swarm_id: str) -> dict[str, Any]:
        """Everything stored about a swarm, comparable with ==."""
        return {
            "swarm": dict(await self.swarm(swarm_id)),
            "subtasks": {n: dict(r) for n, r in (await self.subtasks(swarm_id)).items()},
            "events": [dict(r) for r in await self.events(swarm_id)],
            "ledger": [dict(r) for r in await self.ledger(swarm_id)],
        }


def owner_pid(owner: str | None) -> int | None:
    """The pid in a lease owner id `host:pid:suffix`."""
    return int(owner.split(":")[1]) if owner else None


# ---- the API -------------------------------------------------------------------------------


async def post_swarm(api: str, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.post(f"{api}/swarms", json=body, headers=headers)
    assert r.status_code == 202, r.text
    data: dict[str, Any] = r.json()
    return data


async def get_swarm(api: str, swarm_id: str, wait: float = 0) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=wait + 10) as client:
        r = await client.get(f"{api}/swarms/{swarm_id}", params={"wait": wait} if wait else {})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def wait_terminal(api: str, swarm_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"swarm {swarm_id} not terminal after {timeout}s")
        try:
            data = await get_swarm(api, swarm_id, wait=min(left, 5))
        except httpx.HTTPError:  # the API replica may be riding out a database restart
            await asyncio.sleep(0.2)
            continue
        if data["status"] in TERMINAL:
            return data


async def sim_stats(sim_url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        data: dict[str, Any] = (await client.get(f"{sim_url}/_stats")).json()
    return data


def answered_usd(stats: dict[str, Any], swarm_id: str | None = None) -> Decimal:
    """What the simulator answered (a real gateway would bill), for one swarm or all."""
    prices = PriceTable.builtin()
    per_swarm = stats["answered"]
    total = Decimal(0)
    for sid in [swarm_id] if swarm_id is not None else list(per_swarm):
        for model, (prompt, completion, cached, _n) in per_swarm.get(sid, {}).items():
            total += prices[model].cost(prompt, completion, cached)
    return total


# ---- what must hold after any crash --------------------------------------------------------


async def assert_durable_outcome(db: Db, api: str, sim_url: str, swarm_id: str,
                                 ok_calls: dict[str, int] | None = None) -> dict[str, Any]:
    """The swarm succeeded; every subtask succeeded exactly once; the gateway answered each
    logical call once (or `ok_calls[name]` times); the ledger has no duplicate attempt and
    sums to the swarm's usage; events are 1..N with one `swarm.completed`, last."""
    data = await get_swarm(api, swarm_id)
    assert data["status"] == "succeeded", data["error"]
    subs = await db.subtasks(swarm_id)
    assert subs, "no subtasks"
    for name, s in subs.items():
        assert s["status"] == "succeeded", (name, s["status"], s["error"])
        assert s["output"], name
    stats = (await sim_stats(sim_url))["by_key"]
    expected = {name: (ok_calls or {}).get(name, 1) for name in subs}
    got = {name: stats.get(f"{swarm_id}:{name}:1", {}).get("ok", 0) for name in subs}
    assert got == expected, "gateway answers per subtask"

    dups = await db.fetch(
        "SELECT idempotency_key, attempt, count(*) FROM gateway_calls WHERE swarm_id = $1 "
        "GROUP BY idempotency_key, attempt HAVING count(*) > 1", swarm_id)
    assert not dups, f"duplicate ledger rows: {dups}"
    rows = await db.ledger(swarm_id)
    assert not [r for r in rows if r["outcome"] == "in_flight"], "an attempt left unsettled"
    ledger = [r for r in rows if r["outcome"] != "cancelled"]  # never sent: no gateway call
    ok_rows = [r for r in ledger if r["outcome"] == "ok"]
    assert sorted(r["subtask_name"] for r in ok_rows) == sorted(subs), "one ok row per subtask"
    total = sum((r["cost_usd"] for r in ledger), Decimal(0))
    assert Decimal(data["usage"]["cost_usd"]) == total
    unresolved = sum((r["cost_usd"] for r in ledger if r["outcome"] == "unknown"), Decimal(0))
    assert Decimal(data["usage"]["unresolved_usd"]) == unresolved
    # what the gateway answered is never more than recorded, and never less than settled
    answered = answered_usd(await sim_stats(sim_url), swarm_id)
    assert total - unresolved <= answered <= total, (total, unresolved, answered)
    assert data["usage"]["gateway_calls"] == len(ledger)
    assert data["usage"]["prompt_tokens"] == sum(r["prompt_tokens"] for r in ledger)
    assert data["usage"]["completion_tokens"] == sum(r["completion_tokens"] for r in ledger)

    events = await db.events(swarm_id)
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert (await db.swarm(swarm_id))["event_seq"] == len(seqs)
    types = [e["type"] for e in events]
    assert types.count("swarm.completed") == 1 and types[-1] == "swarm.completed", types
    succeeded = sorted(e["data"]["name"] for e in events if e["type"] == "subtask.succeeded")
    assert succeeded == sorted(subs), "one subtask.succeeded event per subtask"
    return data


# ---- one service for a test module ---------------------------------------------------------


@contextlib.contextmanager
def live_service(workdir: Path, **env: str) -> Iterator[str]:
    """A real `swarm-api serve` (engine and in-process simulator) on a throwaway PostgreSQL
    database; yields its base URL. Synchronous, for module-scoped fixtures."""
    with throwaway_db("swarm_live") as db_url:
        c = Cluster(db_url, workdir, **env)
        try:
            port = free_port()
            proc = c.spawn("api", ["serve", "--port", str(port)])
            url = f"http://127.0.0.1:{port}"
            # start-up (imports, migrations check, tool servers) takes long on a loaded machine
            asyncio.run(wait_http(proc, f"{url}/readyz", timeout=90, ok_only=True))
            yield url
        except BaseException:
            print(c.logs())
            raise
        finally:
            c.close()
