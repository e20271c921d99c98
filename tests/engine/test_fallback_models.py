"""Fallback models (SPEC §15): a model list wherever a model is named; each model gets the
retry policy, then the next one is tried on retryable failures only; every attempt's ledger
row names the model it was sent to and is priced at it; the budget stays hard across models
(both backends, the simulator's `[[sim down=MODEL]]`)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import select

from app import metrics, tracing
from app.db.tables import Subtask
from app.engine.planner_call import _routed_model
from app.pricing import PriceTable
from tests.conftest import Harness
from tests.helpers import by_name, check_budget, ledger, sse_events

PRICES = PriceTable.builtin()
KIMI, DEEPSEEK, CLAUDE = "kimi-k2.5", "deepseek-v3.2", "claude-sonnet-4.5"
# Retry-After: 0, so the retries of a model that is down are not slept through
KIMI_DOWN = f"[[sim down={KIMI} retry_after=0]]"


def _fallbacks(src: str, dst: str) -> float:
    return float(metrics.model_fallbacks.labels(src, dst)._value.get())


async def _rows(h: Harness, swarm_id: str) -> dict[str, list[tuple[str, int, str]]]:
    """Each subtask's ledger rows: (model, attempt, outcome), in attempt order."""
    out: dict[str, list[tuple[str, int, str]]] = {}
    for row in await ledger(h, swarm_id):
        out.setdefault(str(row.subtask_name), []).append((row.model, row.attempt, row.outcome))
    return {name: sorted(rows, key=lambda r: r[1]) for name, rows in out.items()}


async def test_a_down_primary_moves_every_agent_to_the_fallback(harness: Harness) -> None:
    """Every worker and the synthesizer spend their attempts on the model that is down, then
    answer on the next: ledger rows per model, each priced at its own model, the swarm's cost
    their exact sum; the subtask shows the model that answered and one fallback."""
    before = _fallbacks(KIMI, DEEPSEEK)
    body: dict[str, Any] = {
        "task": f"review {KIMI_DOWN}", "model": [KIMI, DEEPSEEK],
        "synthesis": {"model": [KIMI, DEEPSEEK]},
        "limits": {"max_attempts": 2},
        "agents": [{"name": "a"}, {"name": "b"}, {"name": "c", "depends_on": ["a"]}]}
    done = await harness.run(body)
    assert done["status"] == "succeeded", done["error"]
    subs = by_name(done)
    assert set(subs) == {"a", "b", "c", "@synthesizer"}
    for name, sub in subs.items():
        assert (sub["model"], sub["fallbacks"], sub["attempts"]) == (DEEPSEEK, 1, 3), name
    rows = await _rows(harness, done["id"])
    for name in subs:
        # two attempts on the model that is down (its retry policy), the third on the next
        assert rows[name] == [(KIMI, 1, "server_error"), (KIMI, 2, "server_error"),
                              (DEEPSEEK, 3, "ok")], name
    total = Decimal(0)
    for row in await ledger(harness, done["id"]):
        assert row.cost_usd == PRICES[row.model].cost(
            row.prompt_tokens, row.completion_tokens, row.cached_tokens), row.model
        assert row.reserved_usd > 0 and row.idempotency_key.endswith(":1")
        total += row.cost_usd
    assert total > 0 and Decimal(done["usage"]["cost_usd"]) == total
    assert done["usage"]["gateway_calls"] == 12
    assert _fallbacks(KIMI, DEEPSEEK) - before == 4
    async with harness.app.state.sessions() as session:  # what a takeover reads back
        stored = (await session.execute(select(Subtask.name, Subtask.models, Subtask.model)
                                        .where(Subtask.swarm_id == done["id"]))).all()
    assert sorted((n, list(m or []), model) for n, m, model in stored) == sorted(
        (n, [KIMI, DEEPSEEK], DEEPSEEK) for n in subs)
    stream = (await harness.client.get(f"/swarms/{done['id']}/events")).text
    ends = [json.loads(e["data"]) for e in sse_events(stream) if e.get("event") ==
            "subtask.succeeded"]
    assert {(e["name"], e["model"], e["fallbacks"]) for e in ends} == {
        (name, DEEPSEEK, 1) for name in subs}
    usage = (await harness.client.get("/usage", params={"group_by": "model"})).json()
    per_model = {i["key"]: i for i in usage["items"]}
    assert per_model[KIMI]["gateway_calls"] == 8 and Decimal(per_model[KIMI]["cost_usd"]) == 0
    assert Decimal(per_model[DEEPSEEK]["cost_usd"]) == total


async def test_a_rejected_call_never_falls_back(harness: Harness) -> None:
    """A 400 is the request's fault: the next model would refuse it too, so it is not tried."""
    before = _fallbacks(KIMI, DEEPSEEK)
    body = {"task": "t", "synthesis": {"strategy": "none"}, "model": [KIMI, DEEPSEEK],
            "agents": [{"name": "a", "prompt": "[[sim fail=400]]"}]}
    done = await harness.run(body)
    assert (done["status"], done["error"]["code"]) == ("failed", "failure_tolerance_exceeded")
    sub = by_name(done)["a"]
    assert (sub["status"], sub["error"]["code"]) == ("failed", "gateway_rejected")
    assert (sub["model"], sub["fallbacks"], sub["attempts"]) == (KIMI, 0, 1)
    assert await _rows(harness, done["id"]) == {"a": [(KIMI, 1, "client_error")]}
    assert _fallbacks(KIMI, DEEPSEEK) == before


async def test_a_budget_that_fits_the_primary_but_not_the_fallback_stops(
        harness: Harness) -> None:
    """The reservation is made again at the fallback's prices: it does not fit, so the swarm
    stops `budget_exceeded` before the fallback is sent, and never spends past its budget."""
    budget = "0.005"  # deepseek's worst case (~0.0005) fits, claude's (~0.015) does not
    assert PRICES[DEEPSEEK].worst_case(200, 1000) < Decimal(budget)
    assert PRICES[CLAUDE].worst_case(0, 1000) > Decimal(budget)
    body = {"task": f"t [[sim down={DEEPSEEK} retry_after=0]]", "max_tokens": 1000,
            "synthesis": {"strategy": "none"}, "model": [DEEPSEEK, CLAUDE],
            "limits": {"budget_usd": budget, "max_attempts": 2},
            "agents": [{"name": "a"}]}
    await check_budget(harness, body)  # spend == ledger, within the budget, nothing open
    listed = (await harness.client.get("/swarms", params={"limit": 1})).json()["items"][0]
    done = (await harness.client.get(f"/swarms/{listed['id']}")).json()
    assert (done["status"], done["error"]["code"]) == ("failed", "budget_exceeded")
    assert await _rows(harness, done["id"]) == {
        "a": [(DEEPSEEK, 1, "server_error"), (DEEPSEEK, 2, "server_error")]}
    assert Decimal(done["usage"]["cost_usd"]) <= Decimal(budget)
    assert CLAUDE not in harness.sim_stats.by_model  # never sent


async def test_every_model_it_lists_is_down_then_a_retry_starts_at_the_first(
        harness: Harness) -> None:
    """Both models down: the subtask fails on the last (one fallback). Its retry keeps the
    list and starts at the first model again."""
    both = f"[[sim down={KIMI},{DEEPSEEK} retry_after=0]]"
    body = {"task": "t", "synthesis": {"strategy": "none"},
            "limits": {"max_attempts": 2},
            "agents": [{"name": "a", "prompt": both, "model": [KIMI, DEEPSEEK]}]}
    done = await harness.run(body)
    sub = by_name(done)["a"]
    assert (sub["status"], sub["error"]["code"]) == ("failed", "gateway_unavailable")
    assert (sub["model"], sub["fallbacks"]) == (DEEPSEEK, 1)
    expected = [(KIMI, 1, "server_error"), (KIMI, 2, "server_error"),
                (DEEPSEEK, 3, "server_error"), (DEEPSEEK, 4, "server_error")]
    assert await _rows(harness, done["id"]) == {"a": expected}
    r = await harness.client.post(f"/swarms/{done['id']}/retry")
    assert r.status_code == 202, r.text
    again = await harness.wait(r.json()["id"])
    assert (by_name(again)["a"]["model"], by_name(again)["a"]["fallbacks"]) == (DEEPSEEK, 1)
    assert await _rows(harness, again["id"]) == {"a": expected}


async def test_a_planned_swarm_falls_back_for_the_planner_and_its_workers(
        harness: Harness) -> None:
    body = {"task": f"plan it {KIMI_DOWN}", "model": [KIMI, DEEPSEEK],
            "orchestrator": {"routing": "pinned", "max_subtasks": 2},
            "synthesis": {"strategy": "concatenate"}, "limits": {"max_attempts": 1}}
    done = await harness.run(body)
    assert done["status"] == "succeeded", done["error"]
    subs = by_name(done)
    assert len(subs) >= 2
    assert {(s["model"], s["fallbacks"]) for s in subs.values()} == {(DEEPSEEK, 1)}


@pytest.mark.parametrize(("body", "field", "model"), [
    ({"model": [KIMI, "no-such-model"]}, "model.1", "no-such-model"),
    ({"agents": [{"name": "a", "model": ["nope", KIMI]}]}, "agents.0.model.0", "nope"),
    ({"synthesis": {"model": [KIMI, "nope"]}}, "synthesis.model.1", "nope"),
    ({"orchestrator": {"model": [DEEPSEEK, "nope"]}}, "orchestrator.model.1", "nope"),
])
async def test_an_unpriced_model_in_a_list_is_refused(
        api: Harness, body: dict[str, Any], field: str, model: str) -> None:
    r = await api.post({"task": "t", **body})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert (error["code"], error["details"]["field"], error["details"]["model"]) == (
        "unknown_model", field, model)


@pytest.mark.parametrize("model", [[], [KIMI, KIMI], [KIMI] * 9, [KIMI, 3]])
async def test_a_model_list_must_be_short_distinct_names(api: Harness, model: Any) -> None:
    r = await api.post({"task": "t", "model": model})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"]


async def test_one_model_named_as_a_string_runs_as_before(harness: Harness) -> None:
    done = await harness.run({"task": "t", "model": DEEPSEEK, "agents": [{"name": "a"}],
                              "synthesis": {"strategy": "none"}})
    assert done["spec"]["model"] == DEEPSEEK
    assert (by_name(done)["a"]["model"], by_name(done)["a"]["fallbacks"]) == (DEEPSEEK, 0)


async def test_the_facade_takes_a_model_list_for_a_swarm(harness: Harness) -> None:
    r = await harness.client.post("/v1/chat/completions", json={
        "model": [KIMI, DEEPSEEK], "messages": [{"role": "user", "content": f"go {KIMI_DOWN}"}],
        "agent_swarm": {"enabled": True, "max_sub_agents": 2,
                        "fan_in_strategy": "concatenate"}})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["model"] == KIMI  # the model asked for first, as OpenAI echoes it
    swarm = (await harness.client.get(f"/swarms/{answer['swarm_id']}")).json()
    assert {(s["model"], s["fallbacks"]) for s in swarm["subtasks"]} == {(DEEPSEEK, 1)}
    assert swarm["spec"]["model"] == [KIMI, DEEPSEEK]


async def test_the_facade_refuses_a_model_list_for_a_passthrough(api: Harness) -> None:
    r = await api.client.post("/v1/chat/completions", json={
        "model": [KIMI, DEEPSEEK], "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "validation_error"


async def test_each_attempt_span_names_the_model_it_was_sent_to(api: Harness) -> None:
    exporter = InMemorySpanExporter()
    tracing.configure([SimpleSpanProcessor(exporter)], env={})
    try:
        done = await api.run({"task": f"t {KIMI_DOWN}", "model": [KIMI, DEEPSEEK],
                              "limits": {"max_attempts": 1}, "agents": [{"name": "a"}],
                              "synthesis": {"strategy": "none"}})
    finally:
        tracing.shutdown()
    assert done["status"] == "succeeded"
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert [(s.name, (s.attributes or {}).get("gen_ai.request.model")) for s in chats] == [
        (f"chat {KIMI}", KIMI), (f"chat {DEEPSEEK}", DEEPSEEK)]


@pytest.mark.parametrize(("model", "hint", "priced", "expected"), [
    (KIMI, DEEPSEEK, True, DEEPSEEK),  # one model: the hint alone, as before lists
    (KIMI, "nope", False, KIMI),
    ([KIMI, DEEPSEEK], CLAUDE, True, [CLAUDE, KIMI, DEEPSEEK]),
    ([KIMI, DEEPSEEK], DEEPSEEK, True, [DEEPSEEK, KIMI]),
    ([KIMI, DEEPSEEK], None, False, [KIMI, DEEPSEEK]),
])
def test_a_planners_hint_goes_in_front_of_the_swarms_list(
        model: Any, hint: str | None, priced: bool, expected: Any) -> None:
    assert _routed_model(model, hint, priced) == expected
