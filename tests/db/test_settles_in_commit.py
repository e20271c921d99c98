"""A tenant cap's settlement carried by a swarm's write (`SwarmWrite.settles`) commits in the
group commit with the ledger row it settles, or not at all: stored with it, fenced out with it,
kept with its money when the rest of the write is refused, never applied twice by a retried
batch; the writer tells the caps which (`on_settled`). Both databases (PostgreSQL: CTEs of the
group commit's one statement; SQLite: its transaction)."""

from __future__ import annotations

import asyncio
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select

from app.db import columns, leases, tenant_cap
from app.db.changes import TenantSettle
from app.db.tables import GatewayCall
from app.db.tenant_tables import TenantDailyReservation
from app.engine.subtask_rows import new_subtask
from app.engine.writer import StateWriter, WriteRejected
from app.states import SubtaskKind
from tests.conftest import Harness, make_settings, start_harness
from tests.writer_support import OWNER, claimed_swarm, write

COST, WORST = Decimal("0.01"), Decimal("0.05")


@pytest.fixture
async def idle(database_url: str) -> Any:
    h, close = await start_harness(make_settings(database_url), run_engine=False)
    yield h
    await close()


async def reserved(h: Harness) -> TenantSettle:
    """A reservation of WORST against the tenant's cap, and its settlement at COST."""
    async with h.app.state.sessions() as s, s.begin():
        check, = await tenant_cap.apply_tenant_ops(s, "default", Decimal(100), [WORST], [],
                                                   OWNER, 30.0)
    assert check.reservation_id is not None
    return TenantSettle("default", check.reservation_id, check.day, COST)


async def cap_state(h: Harness, day: date) -> tuple[Decimal, int, int]:
    """(the tenant's spend that day, its reservations, the ledger's rows)."""
    async with h.app.state.sessions() as s:
        spent = await tenant_cap.tenant_spent(s, "default", day)
        held = len(list((await s.execute(select(TenantDailyReservation.id))).scalars()))
        rows = len(list((await s.execute(select(GatewayCall.id))).scalars()))
    return spent, held, rows


async def commit(h: Harness, *writes: Any) -> tuple[list[Any], list[tuple[int, bool]]]:
    """The writes through one StateWriter; what it told the caps (settlements, stored)."""
    told: list[tuple[int, bool]] = []
    writer = StateWriter(h.app.state.sessions, OWNER, retry_for_s=10,
                         on_settled=lambda settles, stored: told.append((len(settles), stored)))
    writer.start()
    try:
        results = await asyncio.gather(*(writer.submit(w) for w in writes),
                                       return_exceptions=True)
    finally:
        await writer.close()
    return list(results), told


async def test_the_settlement_commits_with_its_ledger_row(idle: Harness) -> None:
    swarm_id, epoch = await claimed_swarm(idle)
    settle = await reserved(idle)
    assert await cap_state(idle, settle.day) == (0, 1, 0)
    results, told = await commit(idle, write(swarm_id, epoch, settles=[settle]))
    assert results == [None] and told == [(1, True)]
    assert await cap_state(idle, settle.day) == (COST, 0, 1)
    # a batch retried after its answer was lost adds nothing twice
    results, _ = await commit(idle, write(swarm_id, epoch, settles=[settle]))
    assert results == [None]
    assert await cap_state(idle, settle.day) == (COST, 0, 1)


async def test_a_fenced_write_settles_nothing(idle: Harness) -> None:
    """Its lease lost, neither the row nor the settlement is stored: the reservation holds its
    worst case, what the next owner bills the attempt's row at."""
    swarm_id, epoch = await claimed_swarm(idle)
    settle = await reserved(idle)
    results, told = await commit(idle, write(swarm_id, epoch - 1, settles=[settle]))
    assert isinstance(results[0], leases.LeaseLost) and told == [(1, False)]
    assert await cap_state(idle, settle.day) == (0, 1, 0)


async def test_a_write_whose_ledger_row_is_refused_settles_nothing(idle: Harness) -> None:
    swarm_id, epoch = await claimed_swarm(idle)
    settle = await reserved(idle)
    bad = write(swarm_id, epoch, settles=[settle])
    bad.ledger[0]["model"] = None  # NOT NULL: refused, alone and as money only
    results, told = await commit(idle, bad)
    assert isinstance(results[0], leases.LeaseLost) and told == [(1, False)]
    assert await cap_state(idle, settle.day) == (0, 1, 0)


async def test_a_refused_write_keeps_its_settlement_with_its_money(idle: Harness) -> None:
    """Text no database stores in one swarm's write: it is retried alone, refused, and its
    ledger rows are kept (the salvage): its settlement with them; the other swarm's write,
    committed in its own, settles its own."""
    good, good_epoch = await claimed_swarm(idle)
    bad, bad_epoch = await claimed_swarm(idle)
    first, second = await reserved(idle), await reserved(idle)
    sub = new_subtask(bad, "a", 0, SubtaskKind.worker, "kimi-k2.5", 100)
    state = {c: getattr(sub, c) for c in columns.SUBTASK_STATE_COLUMNS}
    poisoned = write(bad, bad_epoch, subtasks=[{"name_": "a", "position_": 0, **state,
                                                "status": "succeeded",
                                                "output": "answer \udfff"}],
                     new_subtasks=[], webhook=None, settles=[second])
    results, told = await commit(idle, write(good, good_epoch, settles=[first]), poisoned)
    assert results[0] is None and isinstance(results[1], WriteRejected), results
    assert sorted(told) == [(1, True), (1, True)]
    assert await cap_state(idle, first.day) == (2 * COST, 0, 2)
