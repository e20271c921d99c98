"""A claimed swarm and the group-commit writes of it that the writer's tests send."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from app.db import changes, create, leases
from app.db.types import utcnow
from app.db.webhooks import new_delivery
from app.engine.specs import build_swarm
from app.engine.subtask_rows import new_subtask
from app.schemas import SwarmCreate
from app.states import SubtaskKind
from tests.conftest import Harness, make_settings, start_harness

OWNER = "test-owner"


@pytest.fixture
async def idle(database_url: str) -> AsyncIterator[Harness]:
    """The service on the test's database with its engine off: the writes are the test's."""
    h, close = await start_harness(make_settings(database_url), run_engine=False)
    yield h
    await close()


async def claimed_swarm(h: Harness) -> tuple[str, int]:
    new = build_swarm(SwarmCreate(task="t", agents=[{"name": "a"}]),  # type: ignore[list-item]
                      h.app.state.settings, "default")
    async with h.app.state.sessions() as s, s.begin():
        await create.insert_swarm(s, new.swarm, new.subtasks)
        epoch = await leases.claim_new(s, new.swarm.id, OWNER, 30)
    return new.swarm.id, epoch


# a write of the swarm's state alone: no ledger, events, new subtasks or webhook
BARE: dict[str, Any] = {"ledger": [], "new_subtasks": [], "webhook": None, "events": []}


def write(swarm_id: str, epoch: int, **overrides: Any) -> changes.SwarmWrite:
    now = utcnow()
    swarm = {"status": "running", "spent_usd": Decimal("0.01"), "reserved_usd": Decimal(0),
             "unresolved_usd": Decimal(0),
             "prompt_tokens": 10, "completion_tokens": 5, "gateway_calls": 1, "result": None,
             "error": None, "started_at": now, "finished_at": None, "event_seq": 1,
             "vote": None, "settled_epoch": 0}
    ledger = {"swarm_id": swarm_id, "tenant": "default", "subtask_name": "a",
              "model": "kimi-k2.5", "idempotency_key": f"{swarm_id}:a:1", "attempt": 1,
              "http_status": 200, "outcome": "ok", "prompt_tokens": 10, "completion_tokens": 5,
              "cached_tokens": 0, "cost_usd": Decimal("0.01"), "latency_ms": 3.0,
              "created_at": now}
    extra = new_subtask(swarm_id, "@compress.a", 9, SubtaskKind.compressor, "deepseek-v3.2", 50)
    values: dict[str, Any] = {
        "ledger": [ledger],
        "events": [{"swarm_id": swarm_id, "seq": 1, "type": "swarm.status",
                    "data": {"status": "running"}, "created_at": now}],
        "new_subtasks": [create.insert_row(extra)],
        "webhook": new_delivery(swarm_id, "default", "https://hooks.example/x", now),
    }
    values.update(overrides)
    return changes.SwarmWrite(swarm_id, epoch, swarm, **values)
