"""The pure estimate (app/engine/estimate.py): figures from a plan, prices, history, caps."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from app.db.history import Bucket, Caps, History
from app.engine.context import estimate_prompt_tokens
from app.engine.estimate import (
    OUTPUT_BYTES_PER_TOKEN,
    Plan,
    PlannedCall,
    estimate,
    width_of,
)
from app.pricing import PriceTable
from app.states import SubtaskKind

PRICES = PriceTable.builtin()
KIMI = PRICES["kimi-k2.5"]


def worker(name: str, inputs: tuple[str, ...] = (), max_tokens: int = 500,
           text: str = "Summarise the report.", **kw: Any) -> PlannedCall:
    kw.setdefault("room_chars", 100_000 if inputs else 0)
    return PlannedCall(name, SubtaskKind.worker, "kimi-k2.5", max_tokens,
                       [{"role": "user", "content": text}], inputs=inputs, **kw)


def plan(*calls: PlannedCall, concurrency: int = 8) -> Plan:
    return Plan(list(calls), [], {c.name: list(c.inputs) for c in calls}, concurrency)


def history(bucket: Bucket, tools: bool = False) -> History:
    """The tenant's recent calls: one bucket of kimi-k2.5 workers."""
    return History({("kimi-k2.5", "worker", tools): bucket}, bucket.calls,
                   datetime(2026, 12, 1, tzinfo=UTC))


def test_without_history_answers_are_at_max_tokens_and_max_is_the_reservation() -> None:
    call = worker("a")
    got = estimate(plan(call), PRICES, History({}), Caps())
    bound = estimate_prompt_tokens(call.messages)
    assert got.total.cost_max == KIMI.worst_case(bound, 500)
    assert got.total.cost == got.total.cost_p90
    assert got.total.cost == KIMI.cost(4 + 6, 500)  # 21 bytes at 4 a token, 4 per message
    assert got.view()["basis"] == {"samples": 0, "since": None}


def test_history_sets_expected_and_p90_within_max_tokens() -> None:
    steady = Bucket(calls=10, subtasks=10, prompt_tokens=100, completion_tokens=1000,
                    completion_squares=10 * 100 * 100, turns_squares=10)
    spread = Bucket(calls=10, subtasks=10, prompt_tokens=100, completion_tokens=1000,
                    completion_squares=5 * 20 * 20 + 5 * 180 * 180, turns_squares=10)
    one = estimate(plan(worker("a")), PRICES, history(steady), Caps())
    assert one.total.cost == one.total.cost_p90 == KIMI.cost(10, 100)
    two = estimate(plan(worker("a")), PRICES, history(spread), Caps())
    assert two.total.cost == KIMI.cost(10, 100)
    assert two.total.cost_p90 == KIMI.cost(10, 203)  # 100 + 1.2816 * 80, rounded up
    assert two.samples == 10 and two.since is not None
    capped = estimate(plan(worker("a", max_tokens=50)), PRICES,
                      history(spread), Caps())
    assert capped.total.cost == capped.total.cost_p90 == KIMI.cost(10, 50)


def test_too_few_samples_are_no_history() -> None:
    thin = Bucket(2, 2, 10, 20, 200, 2)
    got = estimate(plan(worker("a")), PRICES, history(thin), Caps())
    assert got.total.cost == KIMI.cost(10, 500)


def test_outputs_carried_by_a_dependent_count_expected_and_bounded() -> None:
    a, b = worker("a", max_tokens=300), worker("b", inputs=("a",))
    got = estimate(plan(a, b), PRICES, History({}), Caps())
    own = estimate_prompt_tokens(b.messages)
    assert got.total.cost_max == (KIMI.worst_case(estimate_prompt_tokens(a.messages), 300)
                                  + KIMI.worst_case(own + 300 * OUTPUT_BYTES_PER_TOKEN, 500))
    assert got.total.cost == KIMI.cost(10, 300) + KIMI.cost(10 + 300, 500)
    narrow = estimate(plan(a, worker("b", inputs=("a",), room_chars=100)), PRICES,
                      History({}), Caps())
    assert narrow.total.cost_max == (KIMI.worst_case(estimate_prompt_tokens(a.messages), 300)
                                     + KIMI.worst_case(own + 100, 500))


def test_tool_agents_take_turns_from_history_or_all_of_them() -> None:
    tool = [{"type": "function", "function": {"name": "s__t", "parameters": {}}}]
    agent = worker("a", tools=tool, max_turns=4)
    bare = estimate(plan(agent), PRICES, History({}), Caps())
    assert bare.total.calls == 4 and bare.total.calls_max == 4
    turns = Bucket(calls=30, subtasks=10, prompt_tokens=30 * 400, completion_tokens=30 * 50,
                   completion_squares=30 * 50 * 50, turns_squares=10 * 9)
    seen = estimate(plan(agent), PRICES, history(turns, tools=True), Caps())
    assert seen.total.calls == 3 and seen.total.calls_max == 4
    assert seen.total.cost == KIMI.cost(400, 50) * 3


def test_reservation_is_the_largest_calls_that_run_at_once() -> None:
    small, big = worker("a", max_tokens=10), worker("b", max_tokens=5000)
    mid = worker("c", max_tokens=1000)
    got = estimate(plan(small, big, mid, concurrency=2), PRICES, History({}), Caps())
    worst = {c.name: KIMI.worst_case(estimate_prompt_tokens(c.messages), c.max_tokens)
             for c in (small, big, mid)}
    assert got.reservation == worst["b"] + worst["c"]
    assert got.total.cost_max == sum(worst.values())


def test_fits_compares_each_cap_with_the_worst_case() -> None:
    got = estimate(plan(worker("a")), PRICES, History({}),
                   Caps(budget=Decimal("1"), tenant_daily=Decimal("0.000001"), daily=None))
    assert got.fits == {"budget": True, "tenant_daily": False, "daily": True}


def test_width_and_depth() -> None:
    deps = {"a": [], "b": [], "c": ["a"], "d": ["c", "b"]}
    assert width_of(deps) == 2
    got = estimate(Plan([], [{"name": "x"}], deps, 8), PRICES, History({}), Caps(),
                   planning_cost=Decimal("0.0012"))
    view = got.view()
    assert (view["width"], view["depth"]) == (2, 3)
    assert view["planning_cost_usd"] == "0.0012" and view["plan"] == {"agents": [{"name": "x"}]}
    assert view["cost_usd"] == {"expected": "0", "p90": "0", "max": "0"}


def test_a_call_made_only_in_some_runs_counts_in_max_alone() -> None:
    maybe = PlannedCall("@synthesizer", SubtaskKind.synthesizer, "kimi-k2.5", 500,
                        [{"role": "user", "content": "Merge."}], inputs=("a",),
                        room_chars=100_000, maybe=True)
    alone = estimate(plan(worker("a")), PRICES, History({}), Caps())
    both = estimate(plan(worker("a"), maybe), PRICES, History({}), Caps())
    assert (both.total.cost, both.total.calls) == (alone.total.cost, alone.total.calls)
    assert both.total.cost_max > alone.total.cost_max and both.total.calls_max == 2
