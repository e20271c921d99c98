"""app.aio: what a cancelled caller of run_to_end waits for; alongside's order; Within's
timeout against an outside cancellation; wait_for keeping a cancellation that races its end;
woken's answer."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from app.aio import Within, alongside, run_to_end, wait_for, woken


async def test_a_cancelled_caller_goes_on_only_after_the_work_ended() -> None:
    log: list[str] = []

    async def work() -> str:
        await asyncio.sleep(0.05)
        log.append("work done")
        return "ok"

    async def caller() -> str:
        try:
            return await run_to_end(work())
        except asyncio.CancelledError:
            log.append("caller cancelled")
            raise

    task = asyncio.create_task(caller())
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()  # twice: still waits
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["work done", "caller cancelled"]  # asyncio.shield: the other way round


async def test_its_result_and_errors_reach_the_caller() -> None:
    async def fails() -> None:
        raise ValueError("no")

    assert await run_to_end(asyncio.sleep(0, "x")) == "x"
    with pytest.raises(ValueError, match="no"):
        await run_to_end(fails())


async def test_work_cancelled_itself_cancels_the_caller() -> None:
    inner = asyncio.ensure_future(asyncio.sleep(10))
    outer = asyncio.create_task(run_to_end(inner))
    await asyncio.sleep(0)
    inner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer


async def test_alongside_runs_the_coroutines_first_step_then_the_work() -> None:
    """The coroutine's first step (up to its first wait) runs before the work; both results
    come back; a failing work cancels the coroutine's task and its error is raised."""
    seen: list[str] = []
    release = asyncio.Event()

    async def statement() -> int:
        seen.append("sent")
        await release.wait()  # the database at work
        seen.append("answered")
        return 7

    def work() -> str:
        seen.append("work")
        release.set()
        return "built"

    assert await alongside(statement(), work) == (7, "built")
    assert seen == ["sent", "work", "answered"]

    started: list[asyncio.Task[Any]] = []

    async def never_answered() -> None:
        started.append(asyncio.current_task())  # type: ignore[arg-type]
        await asyncio.Event().wait()

    def failing() -> None:
        raise ValueError("work failed")

    with pytest.raises(ValueError, match="work failed"):
        await alongside(never_answered(), failing)
    await asyncio.sleep(0)
    assert started and started[0].cancelled()


async def test_within_times_out_a_block_that_runs_past_its_delay() -> None:
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        async with Within(0.02):
            await asyncio.sleep(10)
    assert asyncio.get_running_loop().time() - t0 < 5
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await asyncio.sleep(0)  # no cancellation left pending on the task


async def test_within_says_whose_timeout_left_the_block() -> None:
    mine = Within(0.02)
    with pytest.raises(TimeoutError):
        async with mine:
            await asyncio.sleep(10)
    assert mine.expired()
    theirs = Within(10)  # a TimeoutError raised inside (a connect timer's) is not Within's
    with pytest.raises(TimeoutError):
        async with theirs:
            raise TimeoutError("connect")
    assert not theirs.expired()


async def test_within_leaves_a_block_that_ends_in_time_alone() -> None:
    block = Within(10)
    async with block:
        got = await asyncio.sleep(0.01, "done")
    assert got == "done" and not block.expired()
    await asyncio.sleep(0.03)  # its timer is gone: nothing cancels the task later


async def test_within_keeps_an_outside_cancellation_a_cancellation() -> None:
    entered = asyncio.Event()

    async def guarded() -> None:
        async with Within(10):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(guarded())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task



async def test_wait_for_keeps_a_cancellation_that_arrives_as_the_wait_ends() -> None:
    """A loop waiting on an event, cancelled in the step the event is set (a webhook
    delivery ending as its dispatcher stops): the loop ends. asyncio.wait_for of 3.11 takes
    the event's result, drops the cancellation and waits again."""
    event = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            with contextlib.suppress(TimeoutError):
                await wait_for(event.wait(), 10)
            rounds += 1
            event.clear()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)  # it waits on the event
    event.set()
    task.cancel()
    await asyncio.wait([task], timeout=1)
    assert task.cancelled() and rounds == 0


async def test_wait_for_answers_the_result_or_times_out() -> None:
    assert await wait_for(asyncio.sleep(0, "x"), 1) == "x"
    assert await wait_for(asyncio.sleep(0, "y"), None) == "y"
    inner = asyncio.ensure_future(asyncio.sleep(10))
    with pytest.raises(TimeoutError):
        await wait_for(inner, 0.01)
    await asyncio.sleep(0)
    assert inner.cancelled()  # what timed out is cancelled, as asyncio.wait_for does


async def test_woken_says_whether_the_event_fired() -> None:
    event = asyncio.Event()
    assert await woken(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await woken(event, 5) is True
