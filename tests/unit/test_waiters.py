"""SwarmNotifier: what a wake-up says of the swarm's status, and `until_ended` reading the
database only when no commit said it."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from app.engine.waiters import Ended, SwarmNotifier
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
    assert got == Ended(SwarmStatus.failed)


async def test_the_rows_of_the_runner_that_ended_it_reach_its_waiters_only() -> None:
    """A runner ends a swarm: once committed, the writer says so (notify), then the runner
    offers its rows (ended) in the same turn; the waiter gets both. Nobody waiting: nothing
    is kept."""
    n = SwarmNotifier()
    rows: Any = (SimpleNamespace(status=SwarmStatus.succeeded), [object()])
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


async def test_an_answer_is_rendered_only_for_a_waiting_reader_and_reaches_it() -> None:
    """`render` builds the answer only while somebody waits on the swarm and the API set a
    renderer; the answer the runner offers with its rows is the waiter's."""
    n = SwarmNotifier()
    rows: Any = (SimpleNamespace(status=SwarmStatus.succeeded), [object()])
    assert n.render("s", *rows) is None  # no renderer
    n.renderer = lambda swarm, subtasks: b"answer"
    assert n.render("s", *rows) is None  # nobody waits

    async def read() -> SwarmStatus:
        return SwarmStatus.running

    async def runner() -> None:
        await asyncio.sleep(0.01)
        answer = n.render("s", *rows)  # while its end commits
        assert answer == b"answer"
        n.notify("s", "succeeded")
        n.ended("s", *rows, answer)

    task = asyncio.create_task(runner())
    got = await n.until_ended("s", time.monotonic() + 5, read, fallback_s=5)
    await task
    assert got == Ended(SwarmStatus.succeeded, rows, b"answer")


async def test_rows_offered_while_the_first_status_is_read_are_answered() -> None:
    """The swarm ends while the waiter's first read is on its way (armed before it): the read
    says terminal, and the rows its runner offered meanwhile are the answer, not a read back.
    (Under a loaded test suite the end landed in that window and the waiter read it back.)"""
    n = SwarmNotifier()
    rows: Any = (SimpleNamespace(status=SwarmStatus.succeeded), [object()])

    async def read() -> SwarmStatus:
        n.notify("s", "succeeded")  # the end commits during the read...
        n.ended("s", *rows)
        return SwarmStatus.succeeded  # ...which sees it

    got = await n.until_ended("s", time.monotonic() + 5, read, fallback_s=5)
    assert got.status == SwarmStatus.succeeded and got.rows == rows
    assert not n._waiters


async def test_an_end_heard_over_listen_first_waits_for_the_local_runners_rows() -> None:
    """PostgreSQL tells every listener of a commit, this process's own listener too, maybe
    before the commit's own answer reaches its writer: for a swarm run here the waiter waits
    for the runner's rows (its writer's notify and its offer come in one turn). For a swarm
    run elsewhere the end heard is the answer."""
    rows: Any = (SimpleNamespace(status=SwarmStatus.succeeded), [object()])

    async def read() -> SwarmStatus:
        return SwarmStatus.running

    for here in (True, False):
        n = SwarmNotifier()
        n.runs_here = lambda swarm_id, here=here: here and swarm_id == "s"

        async def commit(n: SwarmNotifier = n) -> None:
            await asyncio.sleep(0.01)
            n.notified("s succeeded")  # the LISTEN connection first
            await asyncio.sleep(0.05)  # the commit's own answer, a round trip later
            n.notify("s", "succeeded")
            await asyncio.sleep(0.01)  # the runner resumes after the writer's turn
            n.ended("s", *rows)

        task = asyncio.create_task(commit())
        got = await n.until_ended("s", time.monotonic() + 5, read, fallback_s=5)
        await task
        assert got.status == SwarmStatus.succeeded
        assert got.rows == (rows if here else None)


async def test_a_local_runner_that_stops_without_rows_leaves_its_waiter_to_read() -> None:
    """The end was heard over LISTEN but the local runner stopped without offering rows (its
    lease lost, say): the scheduler's unsaid notify sends the waiter to the database."""
    n = SwarmNotifier()
    running = {"s"}
    n.runs_here = running.__contains__
    reads: list[SwarmStatus] = []

    async def read() -> SwarmStatus:
        reads.append(SwarmStatus.succeeded if reads else SwarmStatus.running)
        return reads[-1]

    async def stops() -> None:
        await asyncio.sleep(0.01)
        n.notified("s succeeded")
        await asyncio.sleep(0.02)
        running.discard("s")
        n.notify("s")  # Scheduler._done for a runner that did not finish

    task = asyncio.create_task(stops())
    got = await n.until_ended("s", time.monotonic() + 5, read, fallback_s=5)
    await task
    assert got == Ended(SwarmStatus.succeeded) and len(reads) == 2
