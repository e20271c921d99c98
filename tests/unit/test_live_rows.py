"""The engine's rows (app/db/tables.py `LiveSwarm`, `LiveSubtask`): the mapped classes'
attributes as plain ones, every column filled, never instrumented, apart from the row they
were copied from."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from sqlalchemy import inspect as sa_inspect

from app.db.columns import SUBTASK_INSERT_COLUMNS
from app.db.create import insert_row
from app.db.live_rows import LiveSubtask, LiveSwarm, live_subtask, live_swarm
from app.db.tables import Subtask, Swarm
from app.engine.subtask_rows import new_subtask
from app.states import SubtaskKind, SubtaskStatus, SwarmStatus

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SWARM_COLUMNS = [p.key for p in sa_inspect(Swarm).column_attrs]


def test_a_new_subtask_is_live_with_every_inserted_column() -> None:
    sub = new_subtask("s1", "a", 0, SubtaskKind.worker, "m", 10)
    assert isinstance(sub, LiveSubtask) and isinstance(sub, Subtask)
    assert sa_inspect(sub, raiseerr=False) is None  # no instance state: nothing instrumented
    assert set(insert_row(sub)) == set(SUBTASK_INSERT_COLUMNS)
    sub.status = SubtaskStatus.running
    assert sub.__dict__["status"] is SubtaskStatus.running  # a plain write
    with pytest.raises(AttributeError, match=r"LiveSubtask\.id was never filled"):
        _ = sub.id  # assigned by the insert: a live row never has it


def test_a_swarm_row_copied_live_keeps_every_column_and_leaves_the_row_alone() -> None:
    row = Swarm(id="s1", tenant="t", status=SwarmStatus.queued, task="do", spec={"limits": {}},
                budget_usd=Decimal("1.5"), spent_usd=Decimal(0), event_seq=2, created_at=NOW)
    live = live_swarm(row)
    assert isinstance(live, LiveSwarm) and sa_inspect(live, raiseerr=False) is None
    assert set(live.__dict__) == set(SWARM_COLUMNS)
    assert (live.id, live.budget_usd, live.event_seq, live.result) == ("s1", Decimal("1.5"), 2,
                                                                       None)
    live.status, live.event_seq = SwarmStatus.running, 3
    assert (row.status, row.event_seq) == (SwarmStatus.queued, 2)
    assert live_swarm(live) is live  # already live: the same object


def test_a_loaded_subtask_copied_live_keeps_its_values() -> None:
    row = Subtask(swarm_id="s1", name="a", position=4, kind=SubtaskKind.worker, model="m",
                  depends_on=["b"], max_tokens=10, status=SubtaskStatus.succeeded,
                  output="done", attempts=2, cost_usd=Decimal("0.01"))
    live = live_subtask(row)
    assert (live.name, live.position, live.depends_on, live.output, live.attempts,
            live.cost_usd) == ("a", 4, ["b"], "done", 2, Decimal("0.01"))
    assert live_subtask(live) is live
