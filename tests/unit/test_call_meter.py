"""CallMeter alone, against a fake swarm: each attempt's ledger row follows the attempt state
machine (written ahead `in_flight`, settled once), the budget is reserved before a row is
written and settled by it, and an abandoned call is `cancelled` before it is sent and
`unknown` after."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

from app.db.tables import Subtask
from app.engine.budget import SwarmBudget
from app.engine.calls import CallMeter
from app.gateway.chat import AttemptRecord, Usage
from app.pricing import BUILTIN_MODELS
from app.states import AttemptOutcome, InvalidTransition

A = AttemptOutcome
MODEL = "deepseek-v3.2"
WORST = Decimal("0.01")


@dataclass
class FakeSwarm:
    """What a meter sees of its swarm: the rows it writes and the money it holds."""

    budget: SwarmBudget = field(default_factory=lambda: SwarmBudget(Decimal(1)))
    ctx: Any = field(default_factory=lambda: SimpleNamespace(
        prices=BUILTIN_MODELS, cap_for=lambda tenant: None))
    swarm: Any = field(default_factory=lambda: SimpleNamespace(
        id="s1", tenant="t", prompt_tokens=0, completion_tokens=0, gateway_calls=0,
        unresolved_usd=Decimal(0)))
    committed: list[dict[str, Any]] = field(default_factory=list)  # durable, in order
    queued: list[dict[str, Any]] = field(default_factory=list)  # commit_soon / submit

    @property
    def journal(self) -> FakeSwarm:
        """Its writes' journal: the fake records them itself."""
        return self

    async def commit(self, subs: Any = (), ledger: Any = (), **_: Any) -> None:
        self.committed += ledger

    def commit_soon(self, subs: Any = (), ledger: Any = (), **_: Any) -> None:
        self.queued += ledger

    def submit(self, ledger: Any) -> asyncio.Future[None]:
        self.queued += ledger
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def rows(self) -> list[tuple[int, str, str]]:
        return [(r["attempt"], r["outcome"], r["model"]) for r in [*self.committed, *self.queued]]


def meter(fake: FakeSwarm, model: str = MODEL) -> CallMeter:
    sub = Subtask(name="a", attempts=0, max_tokens=100, prompt_tokens=0, completion_tokens=0,
                  cost_usd=Decimal(0))
    return CallMeter(fake, sub, WORST, "s1:a:1", model, 50, model)  # type: ignore[arg-type]


def answered(number: int, outcome: AttemptOutcome, status: int = 200) -> AttemptRecord:
    return AttemptRecord(number, status, outcome, Usage(10, 5), 0.01, None, None)


async def test_attempts_are_written_ahead_then_settled_once_each() -> None:
    fake = FakeSwarm()
    m = meter(fake)
    await m.before(1)
    assert fake.committed and fake.committed[-1]["outcome"] == A.in_flight  # before the send
    assert fake.budget.reserved == WORST
    await m.after(answered(1, A.rate_limited, 429))
    await m.before(2)
    await m.after(answered(2, A.ok))
    assert fake.rows() == [(1, A.in_flight, MODEL), (2, A.in_flight, MODEL),
                           (1, A.rate_limited, MODEL)]  # the failure settles at once
    assert [(r["attempt"], r["outcome"]) for r in m.ok_rows] == [(2, A.ok)]  # with the result
    assert m.sub.attempts == 2
    assert fake.budget.reserved == 0
    cost = BUILTIN_MODELS[MODEL].cost(10, 5)
    assert fake.budget.spent == 2 * cost and m.sub.cost_usd == 2 * cost
    assert fake.swarm.gateway_calls == 2


async def test_an_attempt_settles_once() -> None:
    m = meter(FakeSwarm())
    await m.before(1)
    await m.after(answered(1, A.ok))
    with pytest.raises(InvalidTransition):
        await m.after(answered(1, A.ok))


async def test_an_answer_with_no_attempt_open_is_refused() -> None:
    with pytest.raises(InvalidTransition):
        await meter(FakeSwarm()).after(answered(1, A.ok))


async def test_a_call_cut_off_after_it_was_sent_is_unknown_at_its_reservation() -> None:
    fake = FakeSwarm()
    m = meter(fake)
    await m.before(1)
    await m.release()
    assert fake.rows() == [(1, A.in_flight, MODEL), (1, A.unknown, MODEL)]
    unknown = fake.queued[-1]
    assert (unknown["cost_usd"], unknown["at_bound"]) == (WORST, True)
    assert (fake.budget.spent, fake.budget.reserved) == (WORST, 0)
    assert fake.swarm.unresolved_usd == WORST
    await m.release()  # nothing open any more: nothing more is written
    assert len(fake.rows()) == 2


async def test_a_prepared_attempt_never_sent_is_cancelled_for_nothing() -> None:
    fake = FakeSwarm()
    m = meter(fake)
    await m.prepare()
    await m.prepare()  # written ahead already
    assert fake.rows() == [(1, A.in_flight, MODEL)]
    await m.release()
    assert fake.rows() == [(1, A.in_flight, MODEL), (1, A.cancelled, MODEL)]
    assert fake.queued[-1]["cost_usd"] == 0
    assert (fake.budget.spent, fake.budget.reserved) == (0, 0)
    assert m.sub.attempts == 0  # no attempt was made


async def test_a_prepared_attempt_is_sent_without_a_second_row() -> None:
    fake = FakeSwarm()
    m = meter(fake)
    await m.prepare()
    await m.before(1)
    await m.after(answered(1, A.server_error, 503))
    assert fake.rows() == [(1, A.in_flight, MODEL), (1, A.server_error, MODEL)]


async def test_a_row_reserved_in_the_callers_turn_and_withdrawn_is_no_attempt() -> None:
    fake = FakeSwarm()
    m = meter(fake)
    row = m.reserve_ahead()
    assert row is not None and row["outcome"] == A.in_flight
    m.withdraw_ahead()  # never written (a shared cap refused it)
    assert fake.budget.reserved == 0
    await m.release()
    assert fake.rows() == []  # nothing to cancel: the row was never written
    await m.before(1)  # prepared again at its turn
    assert [outcome for _, outcome, _ in fake.rows()] == [A.in_flight]


async def test_a_failed_write_ahead_cancels_its_row_and_frees_its_reservation() -> None:
    fake = FakeSwarm()

    async def refused(subs: Any = (), ledger: Any = (), **_: Any) -> None:
        raise ConnectionError("database gone")

    fake.commit = refused  # type: ignore[method-assign]
    m = meter(fake)
    with pytest.raises(ConnectionError):
        await m.before(1)
    assert fake.rows() == [(1, A.cancelled, MODEL)]
    assert fake.budget.reserved == 0 and m.sub.attempts == 0
