"""SwarmNotifier: what a wake-up says of the swarm's status, and `until_ended` reading the
database only when no commit said it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from app.engine.waiters import SwarmNotifier
from app.states import SwarmStatus


async def test_a_change_keeps_the_terminal_status_and_what_went_unsaid() -> None:
    n = SwarmNotifier()
    armed = n.arm("s")
    n.notify("s", "running")
    assert armed.is_set() and armed.take() == (None, False) and not armed.is_set()
    n.notified("s succeeded")
    n.notify("s", "running")  # a later change never hides the end
    assert armed.take() == (SwarmStatus.succeeded, False)
    n.notified("s")  # an older process's bare id
    n.notify("s", "no-such-status")
    assert armed.take() == (None, True)
    n.disarm("s", armed)
    n.notify("s", "failed")
    assert not armed.is_set()


async def test_until_ended_answers_a_terminal_status_said_without_a_read() -> None:
    n = SwarmNotifier()
    reads: list[SwarmStatus] = []

    async def read() -> SwarmStatus:
        reads.append(SwarmStatus.running)
        return SwarmStatus.running

    async def commits() -> None:
        for status in ("running", "running", "cancelled"):
            await asyncio.sleep(0.01)
            n.notify("s", status)

    task = asyncio.create_task(commits())
    got = await n.until_ended("s", time.monotonic() + 5, read, fallback_s=5)
    await task
    assert got.status == SwarmStatus.cancelled and len(reads) == 1  # the first look only
    assert got.rows is None  # no runner offered its rows


async def test_until_ended_reads_when_a_change_did_not_say_or_nothing_came() -> None:
    n = SwarmNotifier()
    answers = iter([SwarmStatus.running, SwarmStatus.running, SwarmStatus.failed])

    async def read() -> SwarmStatus:
        return next(answers)

    async def bare() -> None:
        await asyncio.sleep(0.01)
        n.notified("s")  # unsaid: read again (running), then the fallback read (failed)

    task = asyncio.create_task(bare())
    got = await n.until_ended("s", time.monotonic() + 5, read, fallback_s=0.05)
    await task
    assert got == (SwarmStatus.failed, None)


async def test_the_rows_of_the_runner_that_ended_it_reach_its_waiters_only() -> None:
    """A runner ends a swarm: once committed, the writer says so (notify), then the runner
    offers its rows (ended) in the same turn; the waiter gets both. Nobody waiting: nothing
    is kept."""
    n = SwarmNotifier()
    rows: Any = (object(), [object()])
    n.ended("other", *rows)  # nobody waits for it
    assert not n._waiters

    async def read() -> SwarmStatus:
        return SwarmStatus.running

    async def runner() -> None:
        await asyncio.sleep(0.01)
        n.notify("s", "succeeded")
        n.ended("s", *rows)

    task = asyncio.create_task(runner())
    got = await n.until_ended("s", time.monotonic() + 5, read, fallback_s=5)
    await task
    assert got.status == SwarmStatus.succeeded and got.rows == rows
    assert not n._waiters  # disarmed: the rows went with the reader


async def test_rows_offered_while_the_first_status_is_read_are_answered() -> None:
    """The swarm ends while the waiter's first read is on its way (armed before it): the read
    says terminal, and the rows its runner offered meanwhile are the answer, not a read back.
    (Under a loaded test suite the end landed in that window and the waiter read it back.)"""
    n = SwarmNotifier()
    rows: Any = (object(), [object()])

    async def read() -> SwarmStatus:
        n.notify("s", "succeeded")  # the end commits during the read...
        n.ended("s", *rows)
        return SwarmStatus.succeeded  # ...which sees it

    got = await n.until_ended("s", time.monotonic() + 5, read, fallback_s=5)
    assert got.status == SwarmStatus.succeeded and got.rows == rows
    assert not n._waiters
