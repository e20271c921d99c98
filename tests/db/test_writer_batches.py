"""How the group commit batches: writes made ready together go in one commit, a write nobody
waits for lingers for one somebody does, work asked while a commit is out runs once after it, a
young lingering write waits for its own swarm, and a heartbeat never deadlocks with a commit."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.db import changes, commit_statement, leases
from app.db.driver import DirectConnection
from app.engine import writer as writer_module
from app.engine.writer import StateWriter
from tests.conftest import Harness, make_settings, start_harness
from tests.writer_support import BARE, OWNER, idle
from tests.writer_support import claimed_swarm as _claimed_swarm
from tests.writer_support import write as _write

__all__ = ["idle"]  # the fixture: a service whose engine does not run


def _batch_sizes(writer: StateWriter, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of writes of each commit the writer makes, in order."""
    batches: list[int] = []
    apply = writer._apply

    async def counted(writes: list[changes.SwarmWrite]) -> set[str]:
        batches.append(len(writes))
        return await apply(writes)

    monkeypatch.setattr(writer, "_apply", counted)
    return batches


async def test_writes_made_ready_together_go_in_one_commit(idle: Harness,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A swarm's start and its first wave's write-ahead: one write, then tasks it made ready
    write in their first step. They share the commit the first one would have had alone."""
    swarm_id, epoch = await _claimed_swarm(idle)
    writer = StateWriter(idle.app.state.sessions, OWNER, retry_for_s=10)
    batches = _batch_sizes(writer, monkeypatch)
    writer.start()

    async def wave() -> None:
        await writer.submit(_write(swarm_id, epoch, **BARE))

    try:
        first = writer.submit(_write(swarm_id, epoch))
        tasks = [asyncio.create_task(wave()) for _ in range(5)]
        await asyncio.gather(first, *tasks)
        assert batches == [6]
    finally:
        await writer.close()


async def test_a_write_nobody_waits_for_lingers_for_one_somebody_does(
        idle: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lingering write (a subtask's start) shares the commit of the next write somebody
    awaits (its result, when the call is fast); alone, it commits once LINGER_S has passed,
    never later; a close flushes it at once."""
    swarm_id, epoch = await _claimed_swarm(idle)
    writer = StateWriter(idle.app.state.sessions, OWNER, retry_for_s=10)
    batches = _batch_sizes(writer, monkeypatch)
    monkeypatch.setattr(writer_module, "LINGER_S", 0.5)
    writer.start()
    try:
        soon = writer.submit(_write(swarm_id, epoch, **BARE), linger=True)
        await asyncio.sleep(0.1)
        assert batches == [] and not soon.done()  # lingering
        await writer.submit(_write(swarm_id, epoch, **BARE))  # somebody waits: both commit
        assert batches == [2] and soon.done()

        t0 = time.monotonic()
        await writer.submit(_write(swarm_id, epoch, **BARE), linger=True)  # alone
        assert 0.45 <= time.monotonic() - t0 < 2.0 and batches == [2, 1]

        last = writer.submit(_write(swarm_id, epoch, **BARE), linger=True)
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await writer.close()
        assert last.done() and last.exception() is None and batches == [2, 1, 1]
        assert time.monotonic() - t0 < 0.4  # flushed, not lingered out
    finally:
        await writer.close()


async def test_work_asked_meanwhile_runs_once_while_the_commit_is_out(
        idle: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """`submit(meanwhile=...)`: the work runs after the batch's statement went out and before
    its commit resolved the write, once even when the batch is retried per swarm; its error
    is logged, and the write commits regardless."""
    a, a_epoch = await _claimed_swarm(idle)
    writer = StateWriter(idle.app.state.sessions, OWNER, retry_for_s=10)
    log: list[str] = []
    apply = writer._apply
    refuse = [True]

    async def traced(writes: list[changes.SwarmWrite]) -> set[str]:
        log.append("sent")
        await asyncio.sleep(0.05)  # the database at work
        if refuse:  # the first batch fails: it is retried per swarm
            refuse.pop()
            raise ValueError("refused")
        fenced = await apply(writes)
        log.append("committed")
        return fenced

    def work() -> None:
        log.append("work")
        raise RuntimeError("the work's own failure")

    monkeypatch.setattr(writer, "_apply", traced)
    writer.start()
    try:
        await writer.submit(_write(a, a_epoch, **BARE), meanwhile=work)
        assert log == ["sent", "work", "sent", "committed"]
    finally:
        await writer.close()


async def test_a_young_lingering_write_waits_for_its_own_swarm_not_anothers_commit(
        idle: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Swarm a's start lingers; swarm b's awaited write commits without it while it is
    younger than HOLD_S, and a's own awaited write (its result) takes it: a's move is one
    commit. Older than HOLD_S, a lingering write goes with any swarm's commit, as before."""
    a, a_epoch = await _claimed_swarm(idle)
    b, b_epoch = await _claimed_swarm(idle)
    writer = StateWriter(idle.app.state.sessions, OWNER, retry_for_s=10)
    applied: list[list[str]] = []
    apply = writer._apply

    async def recorded(writes: list[changes.SwarmWrite]) -> set[str]:
        applied.append([w.swarm_id for w in writes])
        return await apply(writes)

    monkeypatch.setattr(writer, "_apply", recorded)
    monkeypatch.setattr(writer_module, "LINGER_S", 5.0)
    monkeypatch.setattr(writer_module, "HOLD_S", 0.3)
    writer.start()
    try:
        start = writer.submit(_write(a, a_epoch, **BARE), linger=True)
        await writer.submit(_write(b, b_epoch, **BARE))  # b's commit: a's start held back
        assert applied == [[b]] and not start.done()
        await writer.submit(_write(a, a_epoch, **BARE))  # a's own: both in one commit
        assert applied == [[b], [a, a]] and start.done()

        old = writer.submit(_write(a, a_epoch, **BARE), linger=True)
        await asyncio.sleep(0.4)  # past HOLD_S, long before LINGER_S
        assert not old.done()
        await writer.submit(_write(b, b_epoch, **BARE))  # now any commit takes it
        assert applied[2:] == [[a, b]] and old.done()
    finally:
        await writer.close()


async def test_a_heartbeat_and_a_group_commit_of_the_same_swarms_never_deadlock(
        database_url: str) -> None:
    """PostgreSQL: the heartbeat (a transaction extending several leases) and the group
    commit (one statement writing several swarms) lock the same swarms' rows; each took them
    in its plan's order (the heartbeat's scan in the table's, the commit's in its document's)
    and the two deadlocked (PostgreSQL aborted one, found by CI). Both now lock them in id
    order. Both at once, many times."""
    if not database_url.startswith("postgresql"):
        pytest.skip("row locks are PostgreSQL's")
    h, close = await start_harness(make_settings(database_url), run_engine=False)
    try:
        swarms = [await _claimed_swarm(h) for _ in range(4)]  # random ids: an order of
        # their own in the table, the reverse of it in the commit's document below
        epochs = dict(swarms)
        direct = DirectConnection(database_url)  # the group commit's connection

        async def beats() -> None:
            for _ in range(150):
                async with h.app.state.sessions() as s, s.begin():
                    assert set(await leases.extend_leases(s, OWNER, epochs, 30)) == set(epochs)
                    await asyncio.sleep(0)  # its locks held across a turn of the loop

        async def commits() -> None:
            for _ in range(150):
                stmt = commit_statement.statement(
                    OWNER, [_write(i, e, **BARE) for i, e in reversed(swarms)])
                assert not stmt.fenced(await direct.fetch(stmt.sql, stmt.args))

        try:
            await asyncio.gather(beats(), commits())
        finally:
            await direct.close()
    finally:
        await close()
