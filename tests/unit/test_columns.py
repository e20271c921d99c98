"""The column registry: every column of a table in one group, and the lists the writes use
generated from the tables, so a new per-attempt column needs no list edited."""

from __future__ import annotations

from app.db import columns as c
from app.db.base import table_of
from app.db.tables import GatewayCall, Subtask, Swarm


def test_every_subtask_column_is_in_one_group() -> None:
    every = [col.key for col in table_of(Subtask).columns]
    assert list(c.SUBTASK_INSERT_COLUMNS) == [k for k in every if k != "id"]
    groups = [set(c.SUBTASK_DEFINITION), set(c.SUBTASK_KEPT), set(c.SUBTASK_RUN),
              {"swarm_id", "reused"}]
    assert set.union(*groups) == set(c.SUBTASK_INSERT_COLUMNS)
    assert sum(map(len, groups)) == len(c.SUBTASK_INSERT_COLUMNS)  # disjoint


def test_the_runner_writes_what_a_run_changes_and_the_model_that_answered() -> None:
    assert set(c.SUBTASK_STATE_COLUMNS) == {*c.SUBTASK_KEPT, *c.SUBTASK_RUN, "model"}
    assert not {"swarm_id", "name", "position", "prompt", "reused"} & set(c.SUBTASK_STATE_COLUMNS)


def test_a_retry_resets_a_run_to_the_columns_defaults() -> None:
    reset = {k: c.default_of(k) for k in c.SUBTASK_RUN}
    assert reset["attempts"].value == 0  # type: ignore[attr-defined]
    assert str(reset["error"]) == "NULL"
    assert reset["cost_usd"].value == 0  # type: ignore[attr-defined]


def test_an_answer_settles_every_ledger_column_but_the_attempts_identity() -> None:
    every = {col.key for col in table_of(GatewayCall).columns}
    assert set(c.LEDGER_SETTLED) == every - set(c.LEDGER_ATTEMPT)
    assert set(c.LEDGER_ATTEMPT) <= every
    # the trap: a row written ahead with one model is settled by the one that answered
    assert {"model", "outcome", "cost_usd", "at_bound"} <= set(c.LEDGER_SETTLED)
    assert "reserved_usd" not in c.LEDGER_SETTLED


def test_the_swarm_state_is_columns_of_swarms() -> None:
    every = {col.key for col in table_of(Swarm).columns}
    assert set(c.SWARM_STATE_COLUMNS) <= every
    assert not {"cancel_requested", "lease_owner", "lease_epoch", "approval"} & set(
        c.SWARM_STATE_COLUMNS)  # the API's and the lease's: never a runner's write
