"""A `serve` started on a PostgreSQL database nobody has migrated yet (SQLite migrates itself),
or not even created: it starts at once, every route that reads the database answers 503
saying what to do, the log says it once a retry in one line (no traceback), and once the
database is there and migrated the same process serves and runs swarms without a restart."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.db.migrate import head_revision
from tests.helpers import UNKNOWN_ID
from tests.procs import Cluster, Proc, cluster, wait_http, wait_terminal
from tests.support import PG_URL, drop_db, free_port, pg_admin, throwaway_db, with_db

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(120)]

NOT_MIGRATED = "database not migrated (run `swarm-api migrate`); retrying"
REQUESTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/swarms", {"task": "t", "agents": [{"name": "a"}]}),
    ("GET", "/swarms", None),
    ("GET", f"/swarms/{UNKNOWN_ID}", None),
    ("GET", f"/swarms/{UNKNOWN_ID}/events", None),
    ("POST", f"/swarms/{UNKNOWN_ID}/cancel", None),
    ("GET", "/usage", None),
]


async def _migrated_then_a_swarm_runs(c: Cluster, serve: Proc, http: httpx.AsyncClient,
                                      base: str) -> None:
    """`swarm-api migrate` from outside, as its operator would; then the same `serve` is
    ready and runs a swarm; nothing it logged all along was a traceback or an error."""
    assert await c.spawn("migrate", ["migrate"]).wait_exit(60) == 0
    await wait_http(serve, f"{base}/readyz", ok_only=True)
    created = await http.post("/swarms", json=REQUESTS[0][2])
    assert created.status_code == 202, created.text
    done = await wait_terminal(base, created.json()["id"])
    assert done["status"] == "succeeded", done
    log = serve.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]


@pytest.fixture
def bare_db() -> Iterator[str]:
    with throwaway_db("swarm_bare", migrate=False) as url:
        yield url


async def test_an_unmigrated_database_answers_503_until_migrated(bare_db: str,
                                                                 tmp_path: Path) -> None:
    async with cluster(bare_db, tmp_path) as c:  # SWARM_AUTO_MIGRATE=0, as in production
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        serve = c.spawn("serve", ["serve", "--port", str(port)])
        await serve.wait_log(f"app.engine.scheduler claiming: {NOT_MIGRATED}")
        await serve.wait_log(f"app.webhooks claiming webhook deliveries: {NOT_MIGRATED}")
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            ready = await http.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert ready.json()["error"]["details"] == {"revision": None, "head": head_revision()}
            for method, path, body in REQUESTS:
                r = await http.request(method, path, json=body)
                assert r.status_code == 503, (method, path, r.text)
                error = r.json()["error"]
                assert error["code"] == "unavailable" and "swarm-api migrate" in error["message"]
                assert "retry-after" not in r.headers  # no retry clears it: its operator must
            r = await http.post("/v1/chat/completions", json={
                "model": "kimi-k2.5", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 503 and r.json()["error"]["type"] == "server_error", r.text
            assert "swarm-api migrate" in r.json()["error"]["message"]

            await _migrated_then_a_swarm_runs(c, serve, http, base)
        # neither alembic's per-start plugin lines nor its two lines per /readyz probe
        assert "alembic" not in serve.log(), serve.log()[-4000:]


async def test_a_database_not_created_yet_holds_no_start(tmp_path: Path) -> None:
    name = f"swarm_later_{uuid.uuid4().hex[:10]}"
    try:
        async with cluster(with_db(PG_URL, name), tmp_path) as c:
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            serve = c.spawn("serve", ["serve", "--port", str(port)])
            await wait_http(serve, f"{base}/healthz", ok_only=True)
            # the facade's stale-attempt settlement retries for 15 s beside the start, not
            # before it: the port opened without waiting for its end
            assert "settling stale passthrough attempts" not in serve.log(), serve.log()
            async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                ready = await http.get("/readyz")
                assert ready.status_code == 503, ready.text
                r = await http.post("/swarms", json=REQUESTS[0][2])
                assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
                assert r.json()["error"]["code"] == "unavailable"
                await serve.wait_log('does not exist); retrying')  # the reason, in a line

                await pg_admin(f'CREATE DATABASE "{name}"')
                await _migrated_then_a_swarm_runs(c, serve, http, base)
    finally:
        await drop_db(name)
