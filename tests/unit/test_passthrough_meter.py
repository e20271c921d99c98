"""PassthroughMeter alone, against a fake database and daily cap: each attempt's ledger row
follows the attempt state machine as CallMeter's do (written ahead `in_flight`, settled
once), the cap holds the worst case while an attempt is open and its cost once answered, and
a request cut off on the wire is `unknown` at its reservation."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

from app.engine.budget import Reservation, SwarmBudget
from app.engine.passthrough import PassthroughMeter
from app.gateway.chat import AttemptRecord, Usage
from app.pricing import BUILTIN_MODELS
from app.states import AttemptOutcome, InvalidTransition

A = AttemptOutcome
PRICE = BUILTIN_MODELS["deepseek-v3.2"]
WORST = Decimal("0.01")


class FakeDatabase:
    """The database as the meter sees it (a session factory, its session and transaction):
    the ledger rows written, in order."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.refusing = False

    def __call__(self) -> FakeDatabase:
        return self

    def begin(self) -> FakeDatabase:
        return self

    async def __aenter__(self) -> FakeDatabase:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def connection(self) -> Any:
        return SimpleNamespace(dialect=SimpleNamespace(name="sqlite"))

    async def execute(self, statement: object, params: list[dict[str, Any]]) -> None:
        if self.refusing:
            raise RuntimeError("statement refused")
        self.rows += params

    def ledger(self) -> list[tuple[int, str]]:
        return [(r["attempt"], r["outcome"]) for r in self.rows]


class FakeCap:
    """A daily cap in memory: the same reserve / settle contract as the database's."""

    def __init__(self) -> None:
        self.budget = SwarmBudget(Decimal(1))

    async def reserve(self, amount: Decimal) -> Reservation:
        return await self.budget.reserve(amount)

    async def settle(self, reservation: Reservation, actual: Decimal) -> None:
        self.budget.settle(reservation, actual)

    def held_ids(self) -> list[str]:
        return []


def meter(db: FakeDatabase, cap: FakeCap) -> PassthroughMeter:
    return PassthroughMeter(db, PRICE, [cap], "t", WORST,  # type: ignore[arg-type]
                            prompt_bound=50, max_tokens=100, lease_s=0.0)


def answered(number: int, outcome: AttemptOutcome, status: int = 200) -> AttemptRecord:
    return AttemptRecord(number, status, outcome, Usage(10, 5), 0.01, None, None)


async def test_attempts_are_written_ahead_then_settled_once_each() -> None:
    db, cap = FakeDatabase(), FakeCap()
    m = meter(db, cap)
    await m.before(1)
    assert db.ledger() == [(1, A.in_flight)]  # durable before the send
    assert cap.budget.reserved == WORST
    await m.after(answered(1, A.rate_limited, 429))
    await m.before(2)
    await m.after(answered(2, A.ok))
    assert db.ledger() == [(1, A.in_flight), (1, A.rate_limited), (2, A.in_flight), (2, A.ok)]
    cost = PRICE.cost(10, 5)
    assert (cap.budget.reserved, cap.budget.spent) == (0, 2 * cost)
    settled = db.rows[-1]
    assert (settled["swarm_id"], settled["subtask_name"], settled["tenant"]) == (None, None, "t")
    assert (settled["model"], settled["idempotency_key"]) == (PRICE.name, m.key)
    assert (settled["cost_usd"], settled["reserved_usd"], settled["at_bound"]) == (
        cost, WORST, False)


async def test_an_attempt_settles_once() -> None:
    db = FakeDatabase()
    m = meter(db, FakeCap())
    await m.before(1)
    await m.after(answered(1, A.ok))
    with pytest.raises(InvalidTransition):
        await m.after(answered(1, A.ok))
    assert db.ledger() == [(1, A.in_flight), (1, A.ok)]


async def test_an_answer_with_no_attempt_open_is_refused() -> None:
    db, cap = FakeDatabase(), FakeCap()
    with pytest.raises(InvalidTransition):
        await meter(db, cap).after(answered(1, A.ok))
    assert db.rows == [] and cap.budget.spent == 0  # nothing billed for no attempt


async def test_a_request_cut_off_after_it_was_sent_is_unknown_at_its_reservation() -> None:
    db, cap = FakeDatabase(), FakeCap()
    m = meter(db, cap)
    await m.before(1)
    await m.release()
    assert db.ledger() == [(1, A.in_flight), (1, A.unknown)]
    unknown = db.rows[-1]
    assert (unknown["cost_usd"], unknown["at_bound"]) == (WORST, True)
    assert (cap.budget.spent, cap.budget.reserved) == (WORST, 0)
    await m.release()  # nothing open any more: nothing more is written
    assert len(db.rows) == 2


async def test_a_request_answered_then_released_writes_no_unknown() -> None:
    db, cap = FakeDatabase(), FakeCap()
    m = meter(db, cap)
    await m.before(1)
    await m.after(answered(1, A.server_error, 503))
    await m.release()
    assert db.ledger() == [(1, A.in_flight), (1, A.server_error)]
    assert cap.budget.spent == PRICE.cost(10, 5)


async def test_a_failed_write_ahead_frees_its_reservation_and_opens_nothing() -> None:
    db, cap = FakeDatabase(), FakeCap()
    db.refusing = True
    m = meter(db, cap)
    with pytest.raises(RuntimeError):
        await m.before(1)
    assert cap.budget.reserved == 0
    await m.release()  # no attempt was sent: nothing is unknown
    assert db.rows == [] and cap.budget.spent == 0
    with pytest.raises(InvalidTransition):  # nor is there one to answer
        await m.after(answered(1, A.ok))
