"""tenant_cap.apply_tenant_ops, one batch of the tenant daily cap (SPEC §8), on both backends
(PostgreSQL runs its own statements): settlements first and on the day they were reserved,
then each reservation that fits, in order; expired reservations of dead owners hold nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import delete, insert, select

from app.aio import wait_for
from app.db import tenant_cap
from app.db.session import SessionFactory, make_db_engine, make_session_factory
from app.db.spend import DailyCheck
from app.db.tenant_tables import TenantDailyReservation, TenantDailySpend
from app.engine.budget import BudgetExceeded
from app.engine.tenancy import TenantDailyCap

CAP = Decimal("1.00")


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[SessionFactory]:
    db = make_db_engine(database_url)
    factory = make_session_factory(db)
    async with factory() as s, s.begin():  # these tables outlive the per-test truncation
        await s.execute(delete(TenantDailyReservation))
        await s.execute(delete(TenantDailySpend))
    yield factory
    await db.dispose()


async def ops(sessions: SessionFactory, reserves: list[str],
              settles: tuple[tenant_cap.Settle, ...] = (), tenant: str = "t") -> list[DailyCheck]:
    async with sessions() as s, s.begin():
        return await tenant_cap.apply_tenant_ops(s, tenant, CAP, [Decimal(a) for a in reserves],
                                             settles, "me", 30.0)


async def spent(sessions: SessionFactory, tenant: str = "t") -> dict[object, Decimal]:
    async with sessions() as s:
        rows = (await s.execute(select(TenantDailySpend.day, TenantDailySpend.spent_usd)
                                .where(TenantDailySpend.tenant == tenant))).all()
    return {day: value for day, value in rows}


async def held(sessions: SessionFactory) -> list[Decimal]:
    async with sessions() as s:
        return sorted((await s.execute(select(TenantDailyReservation.amount))).scalars())


async def test_what_fits_is_reserved_in_order(sessions: SessionFactory) -> None:
    got = await ops(sessions, ["0.60", "0.50", "0.30", "0.20"])
    today = datetime.now(UTC).date()
    assert [c.reservation_id is not None for c in got] == [True, False, True, False]
    assert [(c.left, c.live) for c in got] == [
        (Decimal("1.00"), 0), (Decimal("0.40"), 1), (Decimal("0.40"), 1), (Decimal("0.10"), 2)]
    assert all(c.day == today for c in got)
    assert await held(sessions) == [Decimal("0.30"), Decimal("0.60")]
    assert await spent(sessions) == {today: Decimal(0)}
    (other,) = await ops(sessions, ["0.20"], tenant="other")  # a tenant's cap is its own
    assert other.reservation_id is not None and other.left == Decimal("1.00")


async def test_settlements_come_first_on_the_day_they_were_reserved(
        sessions: SessionFactory) -> None:
    today = datetime.now(UTC).date()
    yesterday = today - timedelta(days=1)
    first, second = await ops(sessions, ["0.60", "0.30"])
    assert first.reservation_id and second.reservation_id
    async with sessions() as s, s.begin():  # an older reservation, made yesterday
        await s.execute(insert(TenantDailySpend).values(tenant="t", day=yesterday,
                                                        spent_usd=Decimal("0.05")))
        await s.execute(insert(TenantDailyReservation).values(
            id="y" * 32, tenant="t", day=yesterday, owner="me", amount=Decimal("0.40"),
            expires_at=datetime.now(UTC) + timedelta(seconds=30)))
    # the 0.60 settles at 0.10, yesterday's at 0.25: the freed 0.50 is there for 0.55 at once
    got = await ops(sessions, ["0.55"], (
        tenant_cap.Settle(first.reservation_id, today, Decimal("0.10")),
        tenant_cap.Settle("y" * 32, yesterday, Decimal("0.25"))))
    assert got[0].reservation_id is not None and got[0].left == Decimal("0.60")
    assert await spent(sessions) == {today: Decimal("0.10"), yesterday: Decimal("0.30")}
    assert await held(sessions) == [Decimal("0.30"), Decimal("0.55")]
    # settling only (no reservation asked): the money moves, the rows go
    assert await ops(sessions, [], (tenant_cap.Settle(second.reservation_id, today,
                                                   Decimal("0.30")),)) == []
    assert await spent(sessions) == {today: Decimal("0.40"), yesterday: Decimal("0.30")}
    assert await held(sessions) == [Decimal("0.55")]


async def test_a_dead_owners_expired_reservation_holds_its_day(sessions: SessionFactory) -> None:
    """Its call may have been sent and billed: it holds its amount for the day (freed, the
    cap would hand that money out again before a takeover counts the call), as not live —
    nothing waits for it; two days on it is gone."""
    now = datetime.now(UTC)
    async with sessions() as s, s.begin():
        await s.execute(insert(TenantDailyReservation).values(
            id="d" * 32, tenant="t", day=now.date(), owner="dead", amount=Decimal("0.90"),
            expires_at=now - timedelta(seconds=1)))
        await s.execute(insert(TenantDailyReservation).values(
            id="o" * 32, tenant="t", day=now.date() - timedelta(days=2), owner="dead",
            amount=Decimal("0.50"), expires_at=now - timedelta(days=2)))
    (refused,) = await ops(sessions, ["0.80"])
    assert refused.reservation_id is None and (refused.left, refused.live) == (
        Decimal("0.10"), 0)
    (got,) = await ops(sessions, ["0.10"])
    assert got.reservation_id is not None
    assert sorted(await held(sessions)) == [Decimal("0.10"), Decimal("0.90")]  # old one gone


async def test_closing_the_cap_fails_what_waits_on_it(sessions: SessionFactory,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A settlement waits for its batch to end (even when its caller is cancelled): closing
    the cap mid-batch must fail the batch's and the queue's operations, not leave them
    waiting forever."""
    started = asyncio.Event()

    async def stuck(self: TenantDailyCap, *args: object) -> list[DailyCheck]:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    monkeypatch.setattr(TenantDailyCap, "_apply", stuck)
    cap = TenantDailyCap(sessions, "t", CAP, "me")
    in_batch = asyncio.create_task(cap.reserve(Decimal("0.1")))
    await wait_for(started.wait(), 5)
    queued = asyncio.create_task(cap.reserve(Decimal("0.2")))
    await asyncio.sleep(0)
    await cap.close()
    for task in (in_batch, queued):
        with pytest.raises(RuntimeError, match="tenant cap closed"):
            await wait_for(task, 5)


async def test_a_settlement_applied_twice_is_counted_once(sessions: SessionFactory) -> None:
    """A batch retried after its answer was lost (the database committed it) finds its
    reservations gone and adds nothing twice; one older than yesterday, which a cleanup may
    have taken before its call ended, is still counted."""
    today = datetime.now(UTC).date()
    (first,) = await ops(sessions, ["0.50"])
    assert first.reservation_id is not None
    settle = tenant_cap.Settle(first.reservation_id, today, Decimal("0.20"))
    await ops(sessions, [], (settle,))
    await ops(sessions, ["0.10"], (settle,))  # the same settlement again, with a reservation
    assert (await spent(sessions))[today] == Decimal("0.20")
    old = today - timedelta(days=3)
    await ops(sessions, [], (tenant_cap.Settle("g" * 32, old, Decimal("0.07")),))
    assert (await spent(sessions))[old] == Decimal("0.07")


async def test_the_cap_reserves_and_settles_through_its_batches(sessions: SessionFactory
                                                                ) -> None:
    """TenantDailyCap's own path (on PostgreSQL one statement alone on a pooled connection):
    what fits is held, what does not is refused once nothing is live, a settlement frees the
    rest of its reservation for the next call."""
    cap = TenantDailyCap(sessions, "t", CAP, "me")
    try:
        first = await cap.reserve(Decimal("0.70"))
        assert await held(sessions) == [Decimal("0.70")]
        await cap.settle(first, Decimal("0.25"))
        assert await held(sessions) == []
        assert (await spent(sessions))[datetime.now(UTC).date()] == Decimal("0.25")
        second = await cap.reserve(Decimal("0.75"))  # fits only because 0.45 came back
        with pytest.raises(BudgetExceeded):
            await cap.settle(second, Decimal("0.75"))
            await cap.reserve(Decimal("0.01"))
    finally:
        await cap.close()


async def test_a_reservation_granted_to_a_cancelled_caller_is_freed(sessions: SessionFactory
                                                                     ) -> None:
    """A call cancelled while its reservation was in the batch (its swarm failed or was
    cancelled) leaves no reservation behind: none would ever settle it, and it would hold
    its money for the rest of the day."""
    cap = TenantDailyCap(sessions, "t", CAP, "me")
    try:
        asked = asyncio.create_task(cap.reserve(Decimal("0.70")))
        await asyncio.sleep(0)  # queued for the next batch
        asked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asked
        await cap.settle(await cap.reserve(Decimal("0.10")), Decimal(0))  # a batch after it
        assert await held(sessions) == []
        assert (await spent(sessions)).get(datetime.now(UTC).date(), Decimal(0)) == 0
    finally:
        await cap.close()
