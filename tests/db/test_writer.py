"""The group commit: idempotent batches, fencing, and errors that must not stall the writer."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import asyncpg
import pytest
from sqlalchemy import func, select

from app.db import changes, columns, leases
from app.db.driver import APPLICATION_NAME
from app.db.notify import CHANGED
from app.db.session import asyncpg_dsn
from app.db.tables import Event, GatewayCall, Subtask, Swarm, Webhook
from app.db.types import utcnow
from app.engine.subtask_rows import new_subtask
from app.engine.writer import StateWriter, WriteRejected
from app.states import SubtaskKind
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import until
from tests.writer_support import OWNER, idle
from tests.writer_support import claimed_swarm as _claimed_swarm
from tests.writer_support import write as _write

__all__ = ["idle"]  # the fixture: a service whose engine does not run


async def _count(h: Harness, model: Any) -> int:
    async with h.app.state.sessions() as s:
        return int((await s.execute(select(func.count()).select_from(model))).scalar_one())


async def test_a_batch_applied_twice_duplicates_nothing(idle: Harness) -> None:
    swarm_id, epoch = await _claimed_swarm(idle)
    writer = StateWriter(idle.app.state.sessions, OWNER, retry_for_s=10)
    writer.start()
    try:
        for _ in range(2):  # a retry after a COMMIT whose outcome was lost
            await writer.submit(_write(swarm_id, epoch))
    finally:
        await writer.close()
    assert await _count(idle, GatewayCall) == 1
    assert await _count(idle, Event) == 1
    assert await _count(idle, Webhook) == 1
    assert await _count(idle, Subtask) == 3  # worker, synthesizer and the compressor, once


async def test_writes_of_another_epoch_are_fenced_out(idle: Harness) -> None:
    swarm_id, epoch = await _claimed_swarm(idle)
    writer = StateWriter(idle.app.state.sessions, OWNER, retry_for_s=10)
    writer.start()
    try:
        with pytest.raises(leases.LeaseLost):
            await writer.submit(_write(swarm_id, epoch - 1))
    finally:
        await writer.close()
    assert await _count(idle, GatewayCall) == 0 and await _count(idle, Event) == 0
    assert await _count(idle, Subtask) == 2  # the compressor was not inserted


async def test_a_broken_batch_fails_at_once_instead_of_retrying(idle: Harness) -> None:
    swarm_id, epoch = await _claimed_swarm(idle)
    writer = StateWriter(idle.app.state.sessions, OWNER, retry_for_s=10)
    writer.start()
    bad = _write(swarm_id, epoch, ledger=[{**_write(swarm_id, epoch).ledger[0], "model": None}])
    t0 = time.monotonic()
    with pytest.raises(leases.LeaseLost):
        await writer.submit(bad)
    assert time.monotonic() - t0 < 2  # not stalled for the 10 s retry window
    await writer.submit(_write(swarm_id, epoch))  # the writer still works
    await writer.close()
    assert await _count(idle, GatewayCall) == 1


async def test_one_swarms_unstorable_write_fails_alone_and_keeps_its_spend(idle: Harness
                                                                            ) -> None:
    """Text no database stores (a lone surrogate) in one swarm's write: the batch is retried
    per swarm, the other swarm's write commits, the refused one keeps only its money."""
    good, good_epoch = await _claimed_swarm(idle)
    bad, bad_epoch = await _claimed_swarm(idle)
    sub = new_subtask(bad, "a", 0, SubtaskKind.worker, "kimi-k2.5", 100)
    state = {c: getattr(sub, c) for c in columns.SUBTASK_STATE_COLUMNS}
    poisoned = _write(bad, bad_epoch, subtasks=[{"name_": "a", "position_": 0, **state,
                                                 "status": "succeeded",
                                                 "output": "answer \udfff"}],
                      new_subtasks=[], webhook=None)
    writer = StateWriter(idle.app.state.sessions, OWNER, retry_for_s=10)
    writer.start()
    # submitted together: one batch, one transaction, until the database refuses it
    results = await asyncio.gather(writer.submit(_write(good, good_epoch)),
                                   writer.submit(poisoned), return_exceptions=True)
    await writer.close()
    assert results[0] is None
    assert isinstance(results[1], WriteRejected), results[1]
    async with idle.app.state.sessions() as s:
        ledger = {r.swarm_id: r for r in (await s.execute(select(GatewayCall))).scalars()}
        swarms = {r.id: r for r in (await s.execute(select(Swarm))).scalars()}
        subs = {(r.swarm_id, r.name): r for r in (await s.execute(select(Subtask))).scalars()}
        events = list((await s.execute(select(Event.swarm_id))).scalars())
    assert set(ledger) == {good, bad}  # the refused write's spend is recorded all the same
    assert swarms[bad].spent_usd == Decimal("0.01") and swarms[bad].gateway_calls == 1
    assert subs[(bad, "a")].status == "pending" and subs[(bad, "a")].output is None
    assert events == [good]  # nothing else of the refused write
    assert (good, "@compress.a") in subs and swarms[good].status == "running"


def _state(swarm_id: str, name: str, position: int = 0, **moved: Any) -> dict[str, Any]:
    sub = new_subtask(swarm_id, name, position, SubtaskKind.worker, "kimi-k2.5", 100)
    state = {c: getattr(sub, c) for c in columns.SUBTASK_STATE_COLUMNS}
    return {"name_": name, "position_": position, **state, **moved}


async def _commit(h: Harness, batch: list[changes.SwarmWrite]) -> list[Any]:
    """Through the StateWriter, as the engine commits: submitted together, one batch (one
    statement on PostgreSQL)."""
    writer = StateWriter(h.app.state.sessions, OWNER, retry_for_s=10)
    writer.start()
    try:
        return await asyncio.gather(*(writer.submit(w) for w in batch), return_exceptions=True)
    finally:
        await writer.close()


async def test_the_last_state_of_a_subtask_in_a_batch_wins(idle: Harness) -> None:
    """A subtask moved twice between two commits (started, then succeeded), and one inserted
    and moved in the same batch: each ends in its last state, as if written in order."""
    swarm_id, epoch = await _claimed_swarm(idle)
    first = _write(swarm_id, epoch, subtasks=[_state(swarm_id, "a", status="running")])
    second = _write(swarm_id, epoch, new_subtasks=[], webhook=None, events=[], ledger=[],
                    subtasks=[_state(swarm_id, "a", status="succeeded", output="done"),
                              _state(swarm_id, "@compress.a", 9, status="running", attempts=1)])
    assert await _commit(idle, [first, second]) == [None, None]
    async with idle.app.state.sessions() as s:
        subs = {r.name: r for r in (await s.execute(
            select(Subtask).where(Subtask.swarm_id == swarm_id))).scalars()}
    assert (subs["a"].status, subs["a"].output) == ("succeeded", "done")
    assert (subs["@compress.a"].status, subs["@compress.a"].attempts) == ("running", 1)


async def test_an_attempt_written_ahead_and_settled_in_one_batch_is_one_settled_row(
        idle: Harness) -> None:
    swarm_id, epoch = await _claimed_swarm(idle)
    settled = _write(swarm_id, epoch).ledger[0]
    ahead = {**settled, "outcome": "in_flight", "http_status": None, "cost_usd": Decimal(0)}
    batch = [_write(swarm_id, epoch, ledger=[ahead]),
             _write(swarm_id, epoch, ledger=[settled], new_subtasks=[], webhook=None, events=[])]
    assert await _commit(idle, batch) == [None, None]
    # and a write-ahead that arrives after its settlement (a retried batch) un-settles nothing
    assert await _commit(idle, [_write(swarm_id, epoch, ledger=[ahead], new_subtasks=[],
                                       webhook=None, events=[])]) == [None]
    async with idle.app.state.sessions() as s:
        rows = list((await s.execute(select(GatewayCall))).scalars())
    assert [(r.outcome, r.http_status, r.cost_usd) for r in rows] == [
        ("ok", 200, Decimal("0.01"))]


async def test_an_attempt_written_ahead_is_settled_with_the_model_that_answered(
        idle: Harness) -> None:
    """A fallback answers a call whose row was written ahead with the first model: its row
    shows the model that answered (`model` is among the settled columns), in a later batch
    as in the same one."""
    swarm_id, epoch = await _claimed_swarm(idle)
    settled = _write(swarm_id, epoch).ledger[0]
    second = {**settled, "attempt": 2, "model": "deepseek-v3.2"}
    ahead = [{**row, "model": "kimi-k2.5", "outcome": "in_flight", "http_status": None,
              "cost_usd": Decimal(0)} for row in (settled, second)]
    assert await _commit(idle, [_write(swarm_id, epoch, ledger=ahead[:1], **_NO_ROWS)]) == [None]
    assert await _commit(idle, [
        _write(swarm_id, epoch, ledger=[{**settled, "model": "gpt-4.1"}], **_NO_ROWS),
        _write(swarm_id, epoch, ledger=ahead[1:], **_NO_ROWS),
        _write(swarm_id, epoch, ledger=[second], **_NO_ROWS)]) == [None, None, None]
    async with idle.app.state.sessions() as s:
        rows = (await s.execute(select(GatewayCall.attempt, GatewayCall.model, GatewayCall.outcome)
                                .order_by(GatewayCall.attempt))).all()
    assert [tuple(r) for r in rows] == [(1, "gpt-4.1", "ok"), (2, "deepseek-v3.2", "ok")]
    assert "model" in columns.LEDGER_SETTLED


_NO_ROWS: dict[str, Any] = {"new_subtasks": [], "webhook": None, "events": []}


async def test_columns_a_row_leaves_out_get_their_defaults(idle: Harness) -> None:
    swarm_id, epoch = await _claimed_swarm(idle)
    ledger = {k: v for k, v in _write(swarm_id, epoch).ledger[0].items()
              if k not in ("created_at", "cached_tokens")}
    event = {k: v for k, v in _write(swarm_id, epoch).events[0].items() if k != "created_at"}
    before = utcnow()
    assert await _commit(idle, [_write(swarm_id, epoch, ledger=[ledger],
                                       events=[event])]) == [None]
    async with idle.app.state.sessions() as s:
        (call,) = (await s.execute(select(GatewayCall))).scalars()
        (stored,) = (await s.execute(select(Event))).scalars()
    assert call.cached_tokens == 0 and call.created_at >= before
    assert stored.created_at >= before


async def test_a_mixed_batch_writes_the_held_swarm_and_drops_the_fenced_one(
        idle: Harness) -> None:
    held, held_epoch = await _claimed_swarm(idle)
    lost, lost_epoch = await _claimed_swarm(idle)
    results = await _commit(idle, [_write(lost, lost_epoch + 1), _write(held, held_epoch)])
    assert results[0].__class__ is leases.LeaseLost and results[1] is None
    async with idle.app.state.sessions() as s:
        ledger = list((await s.execute(select(GatewayCall.swarm_id))).scalars())
        events = list((await s.execute(select(Event.swarm_id))).scalars())
        subs = list((await s.execute(select(Subtask.swarm_id).where(
            Subtask.name == "@compress.a"))).scalars())
        hooks = list((await s.execute(select(Webhook.swarm_id))).scalars())
        status = {r.id: r.status for r in (await s.execute(select(Swarm.id, Swarm.status)))}
    assert ledger == events == subs == hooks == [held]
    assert status[held] == "running" and status[lost] == "queued"


async def test_postgres_notifies_the_swarms_a_group_commit_wrote(database_url: str) -> None:
    """Readers in other processes (an API's `?wait=`, its event streams) wake on NOTIFY
    swarm_changed, sent by the commit itself: for each written swarm, not a fenced one."""
    if not database_url.startswith("postgresql"):
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    h, close = await start_harness(make_settings(database_url), run_engine=False)
    heard: list[str] = []
    listener = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await listener.add_listener(CHANGED, lambda *args: heard.append(args[3]))
        held, held_epoch = await _claimed_swarm(h)
        lost, lost_epoch = await _claimed_swarm(h)
        await _commit(h, [_write(held, held_epoch), _write(lost, lost_epoch - 1)])
        await until(lambda: bool(heard), 5, "the notification")
        await asyncio.sleep(0.2)  # a second one, if it came, has arrived by now
        assert heard == [f"{held} running"]  # its status after the commit: no re-read
    finally:
        await listener.close()
        await close()


async def test_the_group_commits_own_connection_is_replaced_when_lost(database_url: str
                                                                      ) -> None:
    """PostgreSQL: the writer's connection of its own is killed between two commits (a
    failover, an idle-connection reaper); the next commit reconnects and lands."""
    if not database_url.startswith("postgresql"):
        pytest.skip("the direct connection is PostgreSQL's")
    h, close = await start_harness(make_settings(database_url), run_engine=False)
    writer = StateWriter(h.app.state.sessions, OWNER, retry_for_s=10)
    writer.start()
    try:
        swarm_id, epoch = await _claimed_swarm(h)
        await writer.submit(_write(swarm_id, epoch))
        admin = await asyncpg.connect(asyncpg_dsn(database_url))
        try:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = $1 AND datname = current_database()",
                APPLICATION_NAME)
        finally:
            await admin.close()
        assert killed == 1
        second = _write(swarm_id, epoch, new_subtasks=[], webhook=None, events=[],
                        ledger=[{**_write(swarm_id, epoch).ledger[0], "attempt": 2}])
        await writer.submit(second)
        assert await _count(h, GatewayCall) == 2
    finally:
        await writer.close()
        await close()


TEXT = ('quote " backslash \\ \\u0000 as text, newline\n, tab\t, U+2028 \u2028, emoji 😀, '
        "non-BMP \U0001d518, json-ish {\"a\": [1]}, " + "long " * 2000)


async def test_what_a_batch_writes_reads_back_exactly(idle: Harness) -> None:
    """Text, JSON, money, times and floats through the group commit (one JSON document per
    table on PostgreSQL) come back as they were written."""
    swarm_id, epoch = await _claimed_swarm(idle)
    when = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=timezone(timedelta(hours=5)))
    error = {"code": "x", "message": TEXT[:200], "details": {"big": 2**70, "f": 0.1,
                                                               "nested": ["ü", None, True]}}
    cost = Decimal("0.000000000123")
    write = _write(swarm_id, epoch, subtasks=[_state(
        swarm_id, "a", status="failed", output=TEXT, error=error, cost_usd=cost,
        latency_ms=1e-7, started_at=when, finished_at=when)])
    write.events[0]["data"] = {"text": TEXT[:300], "n": 2**70}
    write.ledger[0]["cost_usd"] = cost
    assert await _commit(idle, [write]) == [None]
    async with idle.app.state.sessions() as s:
        sub = (await s.execute(select(Subtask).where(Subtask.swarm_id == swarm_id,
                                                     Subtask.name == "a"))).scalar_one()
        (call,) = (await s.execute(select(GatewayCall))).scalars()
        (event,) = (await s.execute(select(Event))).scalars()
    assert sub.output == TEXT and sub.error == error
    assert sub.cost_usd == cost and call.cost_usd == cost
    assert sub.latency_ms == 1e-7
    assert sub.started_at == when and sub.started_at.utcoffset() == timedelta(0)
    assert event.data == {"text": TEXT[:300], "n": 2**70}
