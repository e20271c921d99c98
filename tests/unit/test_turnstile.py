"""The pool's turnstile: turns in arrival order, a returned turn straight to the oldest waiter,
timeouts on one shared timer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.aio import wait_for
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
    await wait_for(second, 1)  # the turn went on to the next in line
    assert not gate.try_take()


async def _queued(turns: Turnstile, n: int, timeout: float) -> list[asyncio.Task[None]]:
    waiters = [asyncio.create_task(turns.take(timeout)) for _ in range(n)]
    await asyncio.sleep(0)  # each one queued
    return waiters


async def test_waiters_share_one_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fifty checkouts waiting for a turn arm one timer between them, not one each (an
    `asyncio.timeout` per waiter schedules, reschedules and cancels its own)."""
    loop = asyncio.get_running_loop()
    armed = 0
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        nonlocal armed
        armed += 1
        return call_at(when, callback, *args, **kw)

    monkeypatch.setattr(loop, "call_at", counting)
    turns = Turnstile(1)
    assert turns.try_take()
    waiters = await _queued(turns, 50, 30.0)
    for waiter in waiters:  # each served in its turn, as the one before gives it back
        turns.give()
        await waiter
    turns.give()
    assert armed == 1
    assert turns.try_take()  # the turn came back


async def test_a_waiter_past_its_timeout_fails_and_the_ones_behind_keep_their_turn() -> None:
    turns = Turnstile(1)
    assert turns.try_take()
    early = asyncio.create_task(turns.take(0.05))
    await asyncio.sleep(0)
    late = await _queued(turns, 2, 30.0)
    with pytest.raises(TimeoutError):
        await wait_for(early, 5)
    assert not any(w.done() for w in late)
    turns.give()  # the first of the others, not the one that timed out
    await wait_for(late[0], 5)
    assert not late[1].done()
    turns.give()
    await wait_for(late[1], 5)
    turns.give()
    assert turns.try_take() and not turns.try_take()  # one turn, neither lost nor doubled


async def test_a_timeout_after_a_shorter_one_is_still_kept() -> None:
    """A waiter with a shorter timeout than the one queued before it moves the shared timer
    earlier; the longer one still fails at its own deadline."""
    turns = Turnstile(1)
    assert turns.try_take()
    long = asyncio.create_task(turns.take(0.3))
    await asyncio.sleep(0)
    short = asyncio.create_task(turns.take(0.05))
    with pytest.raises(TimeoutError):
        await wait_for(short, 5)
    assert not long.done()
    with pytest.raises(TimeoutError):
        await wait_for(long, 5)
    turns.give()
    assert turns.try_take()


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    turns = Turnstile(1)
    assert turns.try_take()
    first, second = await _queued(turns, 2, 30.0)
    first.cancel()  # waiting: it leaves the queue, and the next turn is the second's
    await asyncio.sleep(0)
    turns.give()
    await wait_for(second, 5)
    assert first.cancelled()
    turns.give()
    assert turns.try_take() and not turns.try_take()
