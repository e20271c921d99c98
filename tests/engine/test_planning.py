"""Orchestrator decomposition (SPEC §4 "Planning", "Dependency context"), on both databases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import ledger


def subs_by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in data["subtasks"]}


def answer_directive(text: str) -> str:
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'[[sim answer="{quoted}"]]'


async def test_task_only_swarm_plans_runs_workers_and_synthesizes(harness: Harness) -> None:
    data = await harness.run({"task": "Compare three databases for a payments ledger"})
    assert data["status"] == "succeeded", data["error"]
    subs = data["subtasks"]
    kinds = [s["kind"] for s in subs]
    assert kinds[0] == "planner" and kinds[-1] == "synthesizer"
    assert kinds[1:-1] == ["worker"] * 4  # the simulator's default plan
    planner = subs[0]
    assert planner["name"] == "@planner" and planner["attempts"] == 1
    assert json.loads(planner["output"])["subtasks"]
    workers = subs[1:-1]
    assert {w["model"] for w in workers} <= {"deepseek-v3.2", "gemini-2.5-flash"}  # hints
    report = next(w for w in workers if w["depends_on"])
    for dep in report["depends_on"]:
        dep_sub = subs_by_name(data)[dep]
        assert report["started_at"] >= dep_sub["finished_at"]
    assert data["progress"]["total"] == 6 and data["progress"]["succeeded"] == 6
    synth_user = (await harness.stats())["by_key"][f"{data['id']}:@synthesizer:1"][
        "last_messages"][-1]["content"]
    for w in workers:  # every worker's contribution reaches the synthesis, under its name
        assert f"### {w['name']}\n{w['output']}" in synth_user
    # planning is its own phase: one more call, counted in usage
    assert data["usage"]["gateway_calls"] == 6
    assert data["timing"]["critical_path_s"] >= planner["latency_ms"] / 1000


@pytest.mark.parametrize("max_subtasks", [1, 2, 3])
async def test_a_small_planned_swarm_gets_a_plan_it_can_run(harness: Harness,
                                                            max_subtasks: int) -> None:
    """The simulator plans within `orchestrator.max_subtasks` and `max_depth` (its default
    plan has 4 subtasks, 2 deep): a bound of 1-3 is not `plan_invalid`."""
    data = await harness.run({"task": "Compare two databases",
                              "orchestrator": {"max_subtasks": max_subtasks, "max_depth": 1}})
    assert data["status"] == "succeeded", data["error"]
    workers = [s for s in data["subtasks"] if s["kind"] == "worker"]
    assert len(workers) == max_subtasks and not any(w["depends_on"] for w in workers)


@pytest.mark.parametrize("kind,reason", [
    ("cyclic", "cycle"), ("unknown_dep", "unknown_dependency"), ("truncated", "truncated"),
    ("not_json", "not_json"), ("empty", "empty"), ("too_many", "too_many"),
    ("too_deep plan_size=5", "too_deep"), ("duplicate", "duplicate_id"),
])
async def test_invalid_plan_gets_one_repair_then_plan_invalid(harness: Harness, kind: str,
                                                             reason: str) -> None:
    data = await harness.run({"task": f"Plan this [[sim plan={kind}]]",
                              "orchestrator": {"max_subtasks": 8, "max_depth": 3}})
    assert data["status"] == "failed"
    assert data["error"]["code"] == "plan_invalid"
    assert data["error"]["details"]["reason"] == reason
    planner = subs_by_name(data)["@planner"]
    assert planner["status"] == "failed" and planner["attempts"] == 2
    rows = await ledger(harness, data["id"])
    assert [r.idempotency_key.rsplit(":", 1)[1] for r in rows] == ["1", "2"]
    assert data["usage"]["gateway_calls"] == 2 and float(data["usage"]["cost_usd"]) > 0
    assert [s["kind"] for s in data["subtasks"]] == ["planner"]


@pytest.mark.parametrize("kind", ["cyclic", "truncated", "not_json"])
async def test_a_valid_repair_lets_the_swarm_run(harness: Harness, kind: str) -> None:
    data = await harness.run({"task": f"Plan this [[sim plan={kind} plan_times=1]]"})
    assert data["status"] == "succeeded", data["error"]
    planner = subs_by_name(data)["@planner"]
    assert planner["attempts"] == 2 and planner["status"] == "succeeded"
    repair = (await harness.stats())["by_key"][f"{data['id']}:@planner:2"]["last_messages"]
    assert repair[-2]["role"] == "assistant"  # the faulty output is quoted back
    assert "invalid" in repair[-1]["content"]


async def test_model_hints_route_only_to_priced_models(harness: Harness) -> None:
    plan = {"subtasks": [
        {"id": "cheap", "description": "d1", "model_hint": "deepseek-v3.2"},
        {"id": "unknown", "description": "d2", "model_hint": "gpt-99-ultra"},
        {"id": "none", "description": "d3", "depends_on": ["cheap"]}]}
    data = await harness.run({"task": "t " + answer_directive(json.dumps(plan)),
                              "model": "gemini-2.5-flash",
                              "synthesis": {"strategy": "concatenate"}})
    assert data["status"] == "succeeded", data["error"]
    subs = subs_by_name(data)
    assert subs["cheap"]["model"] == "deepseek-v3.2"
    assert subs["unknown"]["model"] == "gemini-2.5-flash"
    assert subs["none"]["model"] == "gemini-2.5-flash"
    assert (await harness.stats())["by_model"].get("gpt-99-ultra") is None


async def test_no_llm_strategies_work_on_planned_swarms(harness: Harness) -> None:
    data = await harness.run({"task": "t", "synthesis": {"strategy": "concatenate"}})
    assert data["status"] == "succeeded"
    assert data["result"]
    assert "synthesizer" not in [s["kind"] for s in data["subtasks"]]
    assert data["usage"]["gateway_calls"] == 5


async def test_a_planned_vote_without_agreement_is_synthesized(harness: Harness) -> None:
    # the planned workers' answers all differ: no majority, a synthesizer merges them
    data = await harness.run({"task": "t", "synthesis": {"strategy": "vote"}})
    assert data["status"] == "succeeded" and data["vote"]["outcome"] == "no_majority"
    assert [s["kind"] for s in data["subtasks"]][-1] == "synthesizer"
    assert data["result"] == data["subtasks"][-1]["output"]
    assert data["usage"]["gateway_calls"] == 6


async def test_truncated_worker_is_kept_flagged_and_named_to_the_synthesizer(
        harness: Harness) -> None:
    data = await harness.run({"task": "t", "agents": [
        {"name": "long", "system_prompt": "[[sim finish=length]]"}, {"name": "short"}]})
    subs = subs_by_name(data)
    assert data["status"] == "succeeded"
    assert subs["long"]["truncated"] is True and subs["long"]["output"]
    assert subs["short"]["truncated"] is False
    synth_user = (await harness.stats())["by_key"][f"{data['id']}:@synthesizer:1"][
        "last_messages"][-1]["content"]
    assert "### long (truncated" in synth_user


# ---- compression ---------------------------------------------------------------------------

SMALL_WINDOW = """
[models."kimi-k2.5"]
input = 0.60
output = 2.50
context_window = 1200

[models."deepseek-v3.2"]
input = 0.27
output = 0.42
"""


@pytest.fixture
async def small(database_url: str, tmp_path: Path) -> Any:
    models = tmp_path / "models.toml"
    models.write_text(SMALL_WINDOW)
    h, close = await start_harness(make_settings(database_url, models_file=str(models)))
    yield h
    await close()


def fanin(n: int, compress: str = "auto", tokens: int = 300) -> dict[str, Any]:
    agents: list[dict[str, Any]] = [
        {"name": f"d{i}", "system_prompt": f"[[sim completion_tokens={tokens}]]",
         "model": "deepseek-v3.2"} for i in range(n)]
    agents.append({"name": "sink", "prompt": "merge", "max_tokens": 100,
                   "depends_on": [a["name"] for a in agents]})
    return {"task": "t", "agents": agents, "model": "kimi-k2.5",
            "synthesis": {"strategy": "none", "compress": compress}}


async def test_oversized_inputs_are_compressed_by_compressor_subtasks(small: Harness) -> None:
    data = await small.run(fanin(3))
    assert data["status"] == "succeeded", data["error"]
    subs = subs_by_name(data)
    compressors = [s for s in data["subtasks"] if s["kind"] == "compressor"]
    assert sorted(s["name"] for s in compressors) == ["@compress.d0", "@compress.d1",
                                                      "@compress.d2"]
    for c in compressors:
        assert c["model"] == "deepseek-v3.2"  # the cheapest priced model
        assert c["status"] == "succeeded" and c["depends_on"] == [c["name"][10:]]
    sink_user = (await small.stats())["by_key"][f"{data['id']}:sink:1"]["last_messages"][-1][
        "content"]
    for i in range(3):
        assert f"### d{i} (compressed)\n{subs[f'@compress.d{i}']['output']}" in sink_user
        assert subs[f"d{i}"]["output"] not in sink_user


async def test_compressors_run_with_one_slot(small: Harness) -> None:
    """A compressor takes its slots once, as any call (it took them twice: with
    `limits.concurrency` 1 the swarm waited for itself until its deadline)."""
    body = {**fanin(3), "limits": {"concurrency": 1, "deadline_s": 20}}
    data = await small.run(body, timeout=30)
    assert data["status"] == "succeeded", data["error"]
    assert sum(s["kind"] == "compressor" for s in data["subtasks"]) == 3


async def test_inputs_that_fit_are_not_compressed(small: Harness) -> None:
    data = await small.run(fanin(1))
    assert data["status"] == "succeeded"
    assert "compressor" not in [s["kind"] for s in data["subtasks"]]
    sink_user = (await small.stats())["by_key"][f"{data['id']}:sink:1"]["last_messages"][-1][
        "content"]
    assert subs_by_name(data)["d0"]["output"] in sink_user


async def test_compress_never_truncates_visibly(small: Harness) -> None:
    data = await small.run(fanin(3, compress="never"))
    assert data["status"] == "succeeded"
    assert "compressor" not in [s["kind"] for s in data["subtasks"]]
    sink_user = (await small.stats())["by_key"][f"{data['id']}:sink:1"]["last_messages"][-1][
        "content"]
    assert sink_user.count("[... truncated:") == 3
    for i in range(3):
        assert f"### d{i}\n" in sink_user  # nothing dropped


async def test_compress_always_compresses_even_what_fits(small: Harness) -> None:
    data = await small.run(fanin(1, compress="always", tokens=60))
    assert [s["name"] for s in data["subtasks"] if s["kind"] == "compressor"] == [
        "@compress.d0"]


async def test_synthesis_inputs_are_compressed_too(small: Harness) -> None:
    body = fanin(3)
    body["agents"] = body["agents"][:3]  # no sink: the synthesizer takes all three
    body["synthesis"] = {"strategy": "synthesize", "compress": "auto", "max_tokens": 100}
    data = await small.run(body)
    assert data["status"] == "succeeded", data["error"]
    names = sorted(s["name"] for s in data["subtasks"] if s["kind"] == "compressor")
    assert names == ["@compress.d0", "@compress.d1", "@compress.d2"]
    user = (await small.stats())["by_key"][f"{data['id']}:@synthesizer:1"]["last_messages"][
        -1]["content"]
    assert user.count("(compressed)") == 3
