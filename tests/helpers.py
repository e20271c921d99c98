"""Helpers shared by test modules (a test module never imports another one, see
tests/ops/test_architecture.py): waiting on a condition, agent specs and request bodies, the SPEC
error shape, the ledger, SSE, SQLite's write lock, and the swarms the budget properties draw.
Processes and databases are in tests/support.py and tests/procs.py."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import json
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from app.aio import wait_for
from app.api.deps import DEFAULT_TENANT
from app.db import changes
from app.db.session import make_db_engine
from app.db.tables import GatewayCall, Swarm
from app.states import NOT_BILLED
from tests.conftest import Harness

T = TypeVar("T")

# ---- waiting on a condition ----------------------------------------------------------------


async def until(probe: Callable[[], Awaitable[T | None] | T | None], timeout: float, what: str,
                every: float = 0.05) -> T:
    """Poll `probe` (sync or async) until it returns something truthy and return that; fail
    naming `what` after `timeout` seconds. Tests wait on a condition, never by sleeping."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(every)


# ---- agents and bodies ---------------------------------------------------------------------

SLOW = "[[sim latency_ms=3000]]"


def slow_prompt(ms: int) -> str:
    """A worker's prompt the simulator answers after `ms`."""
    return f"[[sim latency_ms={ms}]] You are a careful engineer."


# a well-formed id no swarm has (fixed: parametrized test ids must agree between xdist workers)
UNKNOWN_ID = "5b0c9c1e-2f4e-4b8a-9d63-0e7a1f2c4d58"

BODY: dict[str, Any] = {
    "task": "Review the migration",
    "agents": [{"name": "analyst", "system_prompt": "You analyse."},
               {"name": "auditor", "model": "deepseek-v3.2"},
               {"name": "writer", "depends_on": ["analyst", "auditor"]}],
    "metadata": {"ticket": "PAY-1234"},
}


def agent(name: str, directives: str = "", **kw: Any) -> dict[str, Any]:
    """An agent; `directives` (e.g. `[[sim latency_ms=1500]]`) go into its system prompt."""
    return {"name": name, "system_prompt": f"You are {name}. {directives}".strip(), **kw}


def by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in data["subtasks"]}


async def subtask_running(h: Harness, swarm_id: str) -> bool:
    """Some subtask of the swarm is running (for `until`)."""
    r = await h.client.get(f"/swarms/{swarm_id}")
    assert r.status_code == 200, r.text
    return bool(r.json()["progress"]["running"] > 0)


# ---- the SPEC error shape ------------------------------------------------------------------


def error_of(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """Assert the SPEC error shape with this status (and code); return `error`."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert set(err) == {"code", "message", "details"}, err
    assert isinstance(err["code"], str) and err["code"]
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


def fields_named(err: dict[str, Any]) -> list[str]:
    """The fields an error's details name (pydantic list or domain dict)."""
    details = err["details"]
    if isinstance(details, list):
        for d in details:
            assert set(d) >= {"field", "message"}, d
        return [str(d["field"]) for d in details]
    assert isinstance(details, dict), details
    return [str(details["field"])]


def assert_rejected(r: httpx.Response, status: int, code: str | None, field: str) -> None:
    err = error_of(r, status, code)
    assert field in fields_named(err), (field, err)
    if isinstance(err["details"], list):  # pydantic: each entry says what and why
        for d in err["details"]:
            assert set(d) == {"field", "message", "type", "input"}, d


async def swarm_count(client: httpx.AsyncClient) -> int:
    r = await client.get("/swarms", params={"limit": 200})
    assert r.status_code == 200, r.text
    return len(r.json()["items"])


async def stored_swarms(h: Harness) -> int:
    """How many swarms the database holds: exact however many, and cheap (no listing)."""
    async with h.app.state.sessions() as s:
        return int((await s.execute(select(func.count()).select_from(Swarm))).scalar_one())


# ---- the ledger and events -----------------------------------------------------------------


async def ledger(h: Harness, swarm_id: str) -> list[GatewayCall]:
    async with h.app.state.sessions() as s:
        rows = await s.execute(select(GatewayCall).where(GatewayCall.swarm_id == swarm_id)
                               .order_by(GatewayCall.id))
        return list(rows.scalars())


def sse_events(text: str) -> list[dict[str, str]]:
    """Events of a text/event-stream body as the HTML spec parses them (comments skipped)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            event[name] = event[name] + "\n" + value if name == "data" and name in event \
                else value
        if "data" in event:
            events.append(event)
    return events


def parse_sse(text: str) -> list[dict[str, Any]]:
    """SSE frames as {"id", "event", "data"} with `data` decoded (comments and pings
    dropped)."""
    return [{**e, "data": json.loads(e["data"])} for e in sse_events(text)]


async def read_events(client: httpx.AsyncClient, swarm_id: str,
                      headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    async def read() -> list[dict[str, Any]]:
        async with client.stream("GET", f"/swarms/{swarm_id}/events",
                                 headers=headers or {}) as r:
            assert r.status_code == 200, await r.aread()
            assert r.headers["content-type"].startswith("text/event-stream")
            return parse_sse((await r.aread()).decode())

    return await wait_for(read(), 10)  # the stream must end by itself


# ---- the budget properties (random swarms, and what must hold after each) ------------------

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
FAULT = "fail=500 times=1 retry_after=0"
MODELS_TOML = """
[models.m-cheap]
input = 0.10
cached_input = 0.01
output = 0.40

[models.m-pricey]
input = "5.00"
cached_input = "0.50"
output = "20.00"
context_window = 32000
"""


@st.composite
def swarms(draw: st.DrawFn, models: tuple[str, ...], cached: bool) -> dict[str, Any]:
    """A random DAG of agents (edges only to earlier agents, so acyclic) with random answer
    sizes, latencies and one-off faults, under a random budget and concurrency."""
    n = draw(st.integers(2, 12))
    agents = []
    for i in range(n):
        max_tokens = draw(st.integers(50, 2000))
        directives = [f"completion_tokens={draw(st.integers(1, max_tokens))}",
                      f"latency_ms={draw(st.integers(0, 20))}"]
        if cached:
            directives.append(f"cached_tokens={draw(st.integers(0, 40))}")
        if draw(st.integers(0, 9)) == 0:
            directives.append(FAULT)
        deps = draw(st.lists(st.sampled_from([f"a{j}" for j in range(i)]), unique=True,
                             max_size=3)) if i else []
        agents.append({"name": f"a{i}", "system_prompt": f"[[sim {' '.join(directives)}]]",
                       "model": draw(st.sampled_from(models)), "max_tokens": max_tokens,
                       "depends_on": deps})
    budget = draw(st.decimals(Decimal("0.0005"), Decimal("0.05"), places=5))
    return {"task": "property", "agents": agents, "model": models[0], "max_tokens": 300,
            "synthesis": {"strategy": draw(st.sampled_from(["synthesize", "concatenate",
                                                            "none"]))},
            "limits": {"concurrency": draw(st.integers(1, 8)), "budget_usd": str(budget)}}


async def check_budget(h: Harness, body: dict[str, Any]) -> None:
    """Run `body`: it ends within its budget (or fails for it), and its spend equals the
    ledger, the per-subtask usage and the call count exactly, with no attempt left open."""
    data = await h.run(body, timeout=60)
    assert data["status"] in ("succeeded", "failed"), data["status"]
    if data["status"] == "failed":
        assert data["error"]["code"] == "budget_exceeded", data["error"]
    spent = Decimal(data["usage"]["cost_usd"])
    assert spent <= Decimal(body["limits"]["budget_usd"])
    async with h.app.state.sessions() as s:
        billed, calls = (await s.execute(
            select(func.sum(GatewayCall.cost_usd), func.count())
            .where(GatewayCall.swarm_id == data["id"],
                   GatewayCall.outcome.not_in(NOT_BILLED)))).one()
        open_rows = (await s.execute(select(func.count()).where(
            GatewayCall.swarm_id == data["id"], GatewayCall.outcome == "in_flight"))).scalar()
    assert (billed or Decimal(0)) == spent  # exactly: Decimal sums on both sides
    assert calls == data["usage"]["gateway_calls"]
    assert open_rows == 0  # every attempt written ahead was settled before the end
    assert sum(Decimal(s["usage"]["cost_usd"]) for s in data["subtasks"]) == spent


def on_sync(url: str, fn: Any) -> Any:
    """`fn(connection)` on a blocking connection to `url` (in a transaction, committed)."""
    async def go() -> Any:
        engine = make_db_engine(url)
        try:
            async with engine.begin() as conn:
                return await conn.run_sync(fn)
        finally:
            await engine.dispose()
    return asyncio.run(go())


def record_batches(h: Harness, monkeypatch: pytest.MonkeyPatch) -> list[list[changes.SwarmWrite]]:
    """Every group commit's writes, in order, as the engine's writer applies them."""
    writer = h.app.state.engine.writer
    batches: list[list[changes.SwarmWrite]] = []
    apply = writer._apply

    async def recorded(writes: list[changes.SwarmWrite]) -> set[str]:
        batches.append(list(writes))
        result: set[str] = await apply(writes)
        return result

    monkeypatch.setattr(writer, "_apply", recorded)
    return batches


# no daily cap (every tenant has one by default): nothing to ask before a row is written ahead
UNCAPPED = """[defaults]
max_agents = 1000
"""


def daily_cap(param: str, tmp_path: Path) -> dict[str, str]:
    """Settings for a harness whose tenant has SPEC §8's daily cap ("capped") or none
    ("uncapped": a tenants file without one)."""
    if param != "uncapped":
        return {}
    (tmp_path / "tenants.toml").write_text(UNCAPPED)
    return {"tenants_file": str(tmp_path / "tenants.toml")}


def capped(h: Harness) -> bool:
    """Whether the swarms' tenant has a daily cap (asked before a row is written ahead)."""
    limits = h.app.state.settings.tenant_limits(DEFAULT_TENANT)
    return limits.daily_budget_usd is not None


# ---- SQLite's write lock -------------------------------------------------------------------


def write_locked(path: Path) -> bool:
    """Whether a writer would have to wait for SQLite's write lock on `path` (not waited for)."""
    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:  # database is locked
        return True
    finally:
        probe.close()


@contextlib.contextmanager
def collection_off() -> Iterator[None]:
    """The garbage collector off for the block: what a collection would free stays, so a lock
    freed only by one shows."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class HeldStatement:
    """A SQL function (`SELECT held()` where it is registered) that keeps the driver's thread
    inside its statement until `release()`: a statement caught running."""

    NAME = "held"

    def __init__(self) -> None:
        self._entered = threading.Event()
        self._released = threading.Event()

    def __call__(self) -> int:  # on the driver's thread
        self._entered.set()
        self._released.wait(10)
        return 1

    async def running(self) -> None:
        """Returns once a statement is inside it."""
        assert await asyncio.to_thread(self._entered.wait, 10), "no statement came"

    def release(self) -> None:
        self._released.set()
