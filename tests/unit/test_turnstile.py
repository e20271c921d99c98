"""The pool's turnstile: turns in arrival order, a returned turn straight to the oldest waiter."""

from __future__ import annotations

import asyncio

import pytest

from app.db.pool import Turnstile


async def test_a_returned_turn_goes_to_the_oldest_waiter_not_a_newcomer() -> None:
    gate = Turnstile(1)
    assert gate.try_take() and not gate.try_take()
    got: list[str] = []

    async def waiter(name: str) -> None:
        await gate.take(5)
        got.append(name)

    tasks = [asyncio.create_task(waiter(n)) for n in ("w1", "w2")]
    await asyncio.sleep(0)  # both queued
    gate.give()
    assert not gate.try_take(), "a newcomer took the turn handed to w1"
    await asyncio.sleep(0)
    assert got == ["w1"]
    gate.give()
    await asyncio.gather(*tasks)
    assert got == ["w1", "w2"]
    gate.give()
    assert gate.try_take()  # nobody waits: the turn is free again


async def test_a_waiter_that_times_out_leaves_no_trace() -> None:
    gate = Turnstile(1)
    assert gate.try_take()
    with pytest.raises(TimeoutError):
        await gate.take(0.01)
    gate.give()
    assert gate.try_take()  # not handed to the waiter that left


async def test_a_turn_handed_to_a_waiter_being_cancelled_passes_on() -> None:
    gate = Turnstile(1)
    assert gate.try_take()
    first = asyncio.create_task(gate.take(5))
    second = asyncio.create_task(gate.take(5))
    await asyncio.sleep(0)
    gate.give()  # first's future is resolved; it is cancelled before it runs
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)  # the turn went on to the next in line
    assert not gate.try_take()
