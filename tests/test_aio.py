"""app.aio.run_to_end: what a cancelled caller waits for."""

from __future__ import annotations

import asyncio

import pytest

from app.aio import run_to_end


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
