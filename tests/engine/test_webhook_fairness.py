"""SPEC §8: webhook deliveries are shared fairly across tenants. A tenant whose receiver never
answers holds at most SWARM_WEBHOOK_TENANT_CONCURRENCY of the sender's slots, and due
deliveries are taken round-robin across tenants: another tenant's webhook arrives as fast as
it does alone. The claim stays a few index lookups at a backlog of 20,000. SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest
from sqlalchemy import insert

from app.db import create
from app.db import webhooks as repo
from app.db.session import SessionFactory, asyncpg_dsn, make_db_engine, make_session_factory
from app.db.tables import Webhook
from app.db.types import utcnow
from app.engine.specs import build_swarm
from app.schemas import SwarmCreate
from app.simulator import SimulatorConfig
from tests.conftest import SKIP_PG, Harness, make_settings, start_harness
from tests.helpers import until
from tests.support import plan_nodes
from tests.webhook_support import read_request

SECRET = "whsec-fair"
HOLD_S = 30.0

# ---- the claim: round-robin across tenants, each tenant capped --------------------------------


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[SessionFactory]:
    engine = make_db_engine(database_url)
    yield make_session_factory(engine)
    await engine.dispose()


async def due(sessions: SessionFactory, database_url: str, tenant: str, n: int,
              start_s: float) -> list[str]:
    """n swarms of a tenant with a delivery due, one second apart from `start_s` ago."""
    settings = make_settings(database_url)
    body = SwarmCreate.model_validate({"task": "t", "agents": [{"name": "a"}]})
    ids = []
    async with sessions() as s, s.begin():
        for i in range(n):
            new = build_swarm(body, settings, tenant)
            await create.insert_swarm(s, new.swarm, new.subtasks)
            at = utcnow() - timedelta(seconds=start_s - i)
            await s.execute(insert(Webhook).values(
                **repo.new_delivery(new.swarm.id, tenant, "https://hooks.example/x", at)))
            ids.append(new.swarm.id)
    return ids


async def claim(sessions: SessionFactory, limit: int, per_tenant: int,
                busy: dict[str, int] | None = None) -> list[str]:
    async with sessions() as s, s.begin():
        hooks = await repo.claim_due(s, limit, HOLD_S, per_tenant, busy or {})
    return [h.swarm_id for h in hooks]


async def test_deliveries_are_claimed_round_robin_across_tenants(
        sessions: SessionFactory, database_url: str) -> None:
    # a's twelve were due long before b's one and c's two
    a = await due(sessions, database_url, "a", 12, start_s=100)
    b = await due(sessions, database_url, "b", 1, start_s=10)
    c = await due(sessions, database_url, "c", 2, start_s=5)
    # the earliest of each tenant first, then each tenant's second
    assert await claim(sessions, 5, per_tenant=4) == [a[0], b[0], c[0], a[1], c[1]]
    # claimed ones are held: not taken again; a tenant at its cap gives none
    assert await claim(sessions, 10, per_tenant=4, busy={"a": 4}) == []
    # a tenant with deliveries in flight goes after one with fewer, and stops at its cap
    assert await claim(sessions, 10, per_tenant=4, busy={"a": 2}) == [a[2], a[3]]
    assert await claim(sessions, 10, per_tenant=4) == [a[4], a[5], a[6], a[7]]


async def test_a_delivery_not_due_yet_is_not_claimed(sessions: SessionFactory,
                                                     database_url: str) -> None:
    later = await due(sessions, database_url, "a", 1, start_s=-60)  # due in a minute
    now = await due(sessions, database_url, "b", 1, start_s=1)
    assert await claim(sessions, 10, per_tenant=4) == now
    assert later and await claim(sessions, 10, per_tenant=4) == []


async def test_two_claimers_take_different_deliveries(pg_sessions: SessionFactory,
                                                      pg_url: str) -> None:
    """Two processes claiming at once (the first not committed yet): the second skips the
    rows the first holds; the rest are taken in turn."""
    a = await due(pg_sessions, pg_url, "a", 6, start_s=100)
    b = await due(pg_sessions, pg_url, "b", 2, start_s=50)
    async with pg_sessions() as first, first.begin():
        one = [h.swarm_id for h in await repo.claim_due(first, 2, HOLD_S, 4, {})]
        two = await claim(pg_sessions, 4, per_tenant=4)
    assert one == [a[0], b[0]]
    assert two == [a[1], b[1]]  # the picks the first one had not locked
    assert await claim(pg_sessions, 4, per_tenant=4) == [a[2], a[3], a[4], a[5]]


@pytest.mark.skipif(SKIP_PG, reason="the plan is PostgreSQL's")
async def test_the_claim_reads_no_tenants_backlog(pg_url: str) -> None:
    """20,000 deliveries of one tenant due (a receiver that never answers, retried) and as
    many delivered: the plan PostgreSQL keeps for the claim reads a few rows per tenant
    through the pending index, not the backlog."""
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        await conn.execute("""
            INSERT INTO swarms (id, tenant, status, task, spec, metadata, spent_usd,
                                reserved_usd, unresolved_usd, prompt_tokens,
                                completion_tokens, gateway_calls, created_at, lease_epoch,
                                event_seq, rescues, cancel_requested)
            SELECT 's' || i, CASE WHEN i = 0 THEN 'b' ELSE 'a' END, 'succeeded', 't', '{}',
                   '{}', 0, 0, 0, 0, 0, 0, now(), 0, 0, 0, false
            FROM generate_series(0, 20000) AS i;
            INSERT INTO webhooks (swarm_id, tenant, url, state, attempts, next_attempt_at,
                                  created_at)
            SELECT id, tenant, 'https://hooks.example/x', 'pending', 1,
                   now() - interval '1 hour' + make_interval(secs => random() * 3000),
                   now() - interval '1 hour'
            FROM swarms;
            -- delivered ones are many more, in time
            INSERT INTO swarms (id, tenant, status, task, spec, metadata, spent_usd,
                                reserved_usd, unresolved_usd, prompt_tokens,
                                completion_tokens, gateway_calls, created_at, lease_epoch,
                                event_seq, rescues, cancel_requested)
            SELECT 'd' || i, 'a', 'succeeded', 't', '{}', '{}', 0, 0, 0, 0, 0, 0, now(), 0, 0,
                   0, false
            FROM generate_series(1, 20000) AS i;
            INSERT INTO webhooks (swarm_id, tenant, url, state, attempts, next_attempt_at,
                                  created_at)
            SELECT id, tenant, 'https://hooks.example/x', 'delivered', 1, now(), now()
            FROM swarms WHERE id LIKE 'd%';
            ANALYZE webhooks""")
        # the plan PostgreSQL keeps for the statement (generic: made for any arguments), run
        positional = repo._PG_CLAIM.element.text
        for i, name in enumerate(("busy_tenants", "busy_counts", "per_tenant", "limit",
                                  "hold"), 1):
            positional = positional.replace(f":{name}", f"${i}")
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            await conn.execute(f"PREPARE kept AS {positional}")
            raw = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) "
                                      "EXECUTE kept(ARRAY['a'], ARRAY[3], 8, 64, 30.0)")
        finally:
            await tx.rollback()
            await conn.execute("DEALLOCATE ALL")
        reads = [n for n in plan_nodes(json.loads(raw)[0]["Plan"])
                 if n.get("Relation Name") == "webhooks"]
        assert reads and all("Seq Scan" not in n["Node Type"] for n in reads), reads
        # a's 5 free slots and b's one, each found through the index: rows read, not 20,000
        assert sum(n["Actual Rows"] * n["Actual Loops"] for n in reads) < 200, reads
    finally:
        await conn.close()
    engine = make_db_engine(pg_url)
    try:
        async with make_session_factory(engine)() as s, s.begin():
            hooks = await repo.claim_due(s, 64, HOLD_S, 8, {"a": 3})
    finally:
        await engine.dispose()
    assert [h.tenant for h in hooks] == ["b", "a", "a", "a", "a", "a"]


# ---- end to end: a receiver that never answers ------------------------------------------------


class Receivers:
    """Real HTTP receivers on loopback: one reads the request and never answers (until the
    sender hangs up), one answers 200 at once and notes when each swarm's webhook arrived."""

    def __init__(self) -> None:
        self.open_now = 0  # connections the silent receiver holds
        self.open_most = 0
        self.silent_seen = 0
        self.arrived: dict[str, float] = {}
        self.servers: list[asyncio.Server] = []

    async def start(self) -> tuple[str, str]:
        urls = []
        for handler in (self._silent, self._answer):
            server = await asyncio.start_server(handler, "127.0.0.1", 0)
            self.servers.append(server)
            urls.append(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook")
        return urls[0], urls[1]

    async def close(self) -> None:
        for server in self.servers:
            server.close()

    async def _silent(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_now += 1
        self.open_most = max(self.open_most, self.open_now)
        try:
            await read_request(reader)
            self.silent_seen += 1
            await reader.read()  # until the sender gives up and closes
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open_now -= 1
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_request(reader)
        self.arrived[json.loads(body)["id"]] = time.monotonic()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()


B = {"Authorization": "Bearer kb"}
A = {"Authorization": "Bearer ka"}


async def _delivered_in(h: Harness, receivers: Receivers, url: str) -> float:
    """Seconds from tenant b's POST to its webhook's arrival."""
    t0 = time.monotonic()
    r = await h.post({"task": "t", "agents": [{"name": "a"}], "webhook_url": url}, headers=B)
    assert r.status_code == 202, r.text
    swarm_id = r.json()["id"]
    await until(lambda: swarm_id in receivers.arrived, 60, "tenant b's webhook")
    return receivers.arrived[swarm_id] - t0


async def test_a_receiver_that_never_answers_delays_only_its_own_tenant(
        database_url: str) -> None:
    receivers = Receivers()
    silent, answering = await receivers.start()
    settings = make_settings(
        database_url, api_keys="a:ka,b:kb", webhook_secret=SECRET, webhook_allow_http=True,
        webhook_allow_private=True, webhook_timeout_s=3.0, poll_interval_s=0.05)
    per_tenant = settings.webhook_tenant_concurrency
    h, close = await start_harness(settings, SimulatorConfig(latency_ms=100))
    try:
        alone = statistics.median([await _delivered_in(h, receivers, answering)
                                   for _ in range(3)])
        # tenant a: 48 swarms whose receiver never answers, all ended and their webhooks due
        ids = []
        for _ in range(48):
            r = await h.post({"task": "t", "agents": [{"name": "a"}], "webhook_url": silent},
                             headers=A)
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
        h.client.headers.update(A)  # the harness's reads are tenant a's
        for swarm_id in ids:
            await h.wait(swarm_id)
        await until(lambda: receivers.open_now >= min(per_tenant, 16), 20,
                    "tenant a's deliveries under way")
        attacked = statistics.median([await _delivered_in(h, receivers, answering)
                                      for _ in range(3)])
        assert attacked <= 2 * alone, (attacked, alone)
        # a's receiver never held more than its tenant's share of the sender
        assert receivers.open_most <= per_tenant, receivers.open_most
    finally:
        await close()
        await receivers.close()
