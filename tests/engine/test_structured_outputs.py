"""Structured outputs (SPEC §15) end to end on both databases, with the simulator: valid,
repaired without a call, repaired with one turn, invalid — each with its ledger rows; a bad
schema; dependents and the synthesizer given JSON; the json_object fallback; the metric."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from app.openai_schemas import EXAMPLE_STRUCTURED_SWARM
from app.schemas import EXAMPLE_STRUCTURED
from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import ledger, sse_events
from tests.mcp_servers import stdio_server, write_config

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"verdict": {"enum": ["ship", "hold"]},
                   "risks": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                   "score": {"type": "integer", "minimum": 3}},
    "required": ["verdict", "risks", "score"],
    "additionalProperties": False,
}
EXPECTED = {"verdict": "ship", "risks": ["xx"], "score": 3}  # the simulator's minimal instance


def body(directive: str = "", **agent: Any) -> dict[str, Any]:
    return {"task": "Review the release", "synthesis": {"strategy": "none"},
            "agents": [{"name": "reviewer", "prompt": f"Review it {directive}",
                        "output_schema": SCHEMA, **agent}]}


def only(data: dict[str, Any], name: str = "reviewer") -> dict[str, Any]:
    return next(s for s in data["subtasks"] if s["name"] == name)


async def calls(h: Harness, swarm_id: str) -> list[tuple[str, str, int | None]]:
    """(call number, outcome, http status) of each ledger row of the swarm."""
    return [(r.idempotency_key.rsplit(":", 1)[1], r.outcome, r.http_status)
            for r in await ledger(h, swarm_id)]


async def assert_costs_add_up(h: Harness, data: dict[str, Any]) -> None:
    rows = await ledger(h, data["id"])
    assert sum((r.cost_usd for r in rows), Decimal(0)) == Decimal(data["usage"]["cost_usd"])
    assert data["usage"]["gateway_calls"] == len(rows)


async def test_a_valid_answer_is_taken_as_it_is_with_one_call(harness: Harness) -> None:
    data = await harness.run(body())
    assert data["status"] == "succeeded", data["error"]
    sub = only(data)
    assert sub["output_status"] == "valid" and sub["output_format"] == "json_schema"
    assert sub["output_json"] == EXPECTED
    assert json.loads(sub["output"]) == EXPECTED  # the JSON text is the output
    assert await calls(harness, data["id"]) == [("1", "ok", 200)]
    await assert_costs_add_up(harness, data)


async def test_an_answer_in_a_fence_is_repaired_without_a_call(harness: Harness) -> None:
    data = await harness.run(body("[[sim output=fence]]"))
    assert data["status"] == "succeeded", data["error"]
    sub = only(data)
    assert sub["output_status"] == "repaired" and sub["output_json"] == EXPECTED
    assert sub["output"] == json.dumps(EXPECTED)  # the fence and the prose are gone
    assert await calls(harness, data["id"]) == [("1", "ok", 200)]


async def test_prose_first_is_repaired_with_one_turn(harness: Harness) -> None:
    data = await harness.run(body("[[sim output=prose]]"))
    assert data["status"] == "succeeded", data["error"]
    sub = only(data)
    assert sub["output_status"] == "repaired" and sub["output_json"] == EXPECTED
    assert sub["attempts"] == 2
    assert await calls(harness, data["id"]) == [("1", "ok", 200), ("2", "ok", 200)]
    await assert_costs_add_up(harness, data)
    # the repair turn replays the answer and says what is wrong
    repair = (await harness.stats())["by_key"][f"{data['id']}:reviewer:2"]["last_messages"]
    assert [m["role"] for m in repair[-2:]] == ["assistant", "user"]
    assert "not JSON" in repair[-1]["content"]


async def test_an_answer_invalid_after_the_repair_turn_fails_the_subtask(
        harness: Harness) -> None:
    data = await harness.run(body("[[sim output=invalid]]"))
    assert data["status"] == "failed"
    sub = only(data)
    assert sub["status"] == "failed" and sub["output_status"] == "invalid"
    assert sub["error"]["code"] == "output_invalid"
    assert any("is not of type 'object'" in e for e in sub["error"]["details"]["errors"])
    assert sub["output_json"] is None
    assert data["error"]["details"]["causes"] == {"output_invalid": 1}
    assert await calls(harness, data["id"]) == [("1", "ok", 200), ("2", "ok", 200)]
    await assert_costs_add_up(harness, data)
    # the validation errors were told in the repair turn
    repair = (await harness.stats())["by_key"][f"{data['id']}:reviewer:2"]["last_messages"]
    assert "(root): ['not', 'an', 'object'] is not of type 'object'" in repair[-1]["content"]


async def test_an_invalid_output_is_counted_by_failure_tolerance(harness: Harness) -> None:
    data = await harness.run({
        "task": "Review", "synthesis": {"strategy": "concatenate"},
        "limits": {"failure_tolerance": 0.5},
        "agents": [{"name": "bad", "prompt": "x [[sim output=invalid]]", "output_schema": SCHEMA},
                   {"name": "good", "prompt": "y"}]})
    assert data["status"] == "succeeded", data["error"]
    assert only(data, "bad")["error"]["code"] == "output_invalid"


async def test_a_gateway_refusing_json_schema_is_asked_with_json_object(
        harness: Harness) -> None:
    data = await harness.run(body("[[sim reject_schema=1]]"))
    assert data["status"] == "succeeded", data["error"]
    sub = only(data)
    assert sub["output_format"] == "json_object" and sub["output_status"] == "valid"
    assert sub["output_json"] == EXPECTED
    # the refused call is billed as any (a 400: no usage), then the json_object call
    assert await calls(harness, data["id"]) == [("1", "client_error", 400), ("2", "ok", 200)]
    await assert_costs_add_up(harness, data)
    asked = (await harness.stats())["by_key"][f"{data['id']}:reviewer:2"]["last_messages"]
    assert asked[0]["role"] == "system" and json.dumps(SCHEMA) in asked[0]["content"]


async def test_dependents_and_the_synthesizer_receive_the_json_text(harness: Harness) -> None:
    data = await harness.run({
        "task": "Review the release",
        "agents": [{"name": "facts", "prompt": "Facts [[sim output=fence]]",
                    "output_schema": SCHEMA},
                   {"name": "writer", "prompt": "Write it up", "depends_on": ["facts"]}]})
    assert data["status"] == "succeeded", data["error"]
    text = json.dumps(EXPECTED)
    by_key = (await harness.stats())["by_key"]
    writer = by_key[f"{data['id']}:writer:1"]["last_messages"][-1]["content"]
    synth = by_key[f"{data['id']}:@synthesizer:1"]["last_messages"][-1]["content"]
    assert text in writer and text in synth
    assert "Here is the result" not in writer + synth  # the fence's prose never travels


async def test_the_synthesis_schema_shapes_the_result(harness: Harness) -> None:
    data = await harness.run({"task": "Review", "agents": [{"name": "a"}, {"name": "b"}],
                              "synthesis": {"output_schema": SCHEMA}})
    assert data["status"] == "succeeded", data["error"]
    assert json.loads(data["result"]) == EXPECTED
    synth = only(data, "@synthesizer")
    assert synth["output_status"] == "valid" and synth["output_json"] == EXPECTED


async def test_events_carry_the_parsed_value_and_the_metric_counts(harness: Harness) -> None:
    data = await harness.run(body("[[sim output=fence]]"))
    r = await harness.client.get(f"/swarms/{data['id']}/events")
    done = [json.loads(e["data"]) for e in sse_events(r.text)
            if e.get("event") == "subtask.succeeded"]
    assert done[0]["output_status"] == "repaired" and done[0]["output_json"] == EXPECTED
    metrics = (await harness.client.get("/metrics")).text
    line = next(x for x in metrics.splitlines()
                if x.startswith('swarm_structured_outputs_total{status="repaired"}'))
    assert float(line.split()[-1]) >= 1


@pytest.mark.parametrize(("schema", "why"), [
    ({"type": "nope"}, "not a valid JSON Schema"),
    ({"$ref": "https://example.com/s.json"}, "points outside the schema"),
    ({"description": "x" * 70_000}, "at most 65536"),
    (json.loads('{"items":' * 40 + "{}" + "}" * 40), "nested deeper"),
    ({"properties": {"code": {"type": "string", "pattern": r"^(\d)\1$"}}},
     "without a linear-time match (backreference or lookaround): invalid escape sequence: "
     "\\1 (at properties/code/pattern)"),
    ({"patternProperties": {"^(?!x-)": {"type": "string"}}},
     "uses a construct without a linear-time match"),
])
async def test_a_bad_schema_is_refused_naming_the_field(harness: Harness, schema: Any,
                                                        why: str) -> None:
    r = await harness.post({"task": "t", "agents": [{"name": "a"}, {"name": "b",
                                                                    "output_schema": schema}]})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_schema" and err["details"]["field"] == "agents.1.output_schema"
    assert why in err["message"]


async def test_a_schema_that_is_no_object_is_refused_naming_the_field(
        harness: Harness) -> None:
    r = await harness.post({"task": "t", "agents": [{"name": "a", "output_schema": "a string"}]})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"][0]["field"] == "agents.0.output_schema"


async def test_the_openapi_examples_run(harness: Harness) -> None:
    data = await harness.run(EXAMPLE_STRUCTURED)
    assert data["status"] == "succeeded", data["error"]
    reviewer = only(data)
    assert reviewer["output_status"] == "valid" and reviewer["output_json"]["verdict"] == "ship"
    r = await harness.client.post("/v1/chat/completions", json=EXAMPLE_STRUCTURED_SWARM)
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == {"ready": True,
                                                                        "why": "xx"}


async def test_a_synthesis_schema_needs_an_llm_to_write_the_result(harness: Harness) -> None:
    r = await harness.post({"task": "t", "agents": [{"name": "a"}],
                            "synthesis": {"strategy": "concatenate", "output_schema": SCHEMA}})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"]["field"] == "synthesis.output_schema"


async def test_a_tool_using_agent_gets_its_repair_turn_after_its_last_turn(
        database_url: str, tmp_path: Path) -> None:
    config = write_config(tmp_path / "mcp.json",
                          {"docs": stdio_server(tmp_path / "docs.log", timeout_s=30)})
    h, close = await start_harness(make_settings(database_url, mcp_config=config))
    try:
        data = await h.run(body("[[sim output=prose turns=1]]", tools=["docs"]))
        assert data["status"] == "succeeded", data["error"]
        sub = only(data)
        assert sub["turns"] == 2 and sub["tool_calls"] >= 1
        assert sub["output_status"] == "repaired" and sub["output_json"] == EXPECTED
        # turn 1 called the tools, turn 2 answered in prose, the repair is call 3
        assert await calls(h, data["id"]) == [("1", "ok", 200), ("2", "ok", 200),
                                              ("3", "ok", 200)]
    finally:
        await close()


async def test_the_repair_turn_is_held_to_the_budget(harness: Harness) -> None:
    """A budget that fits the first call but not the repair turn stops the swarm with
    `budget_exceeded` before the repair is sent: the cap stays hard."""
    probe = await harness.run(body("[[sim output=prose]]"))
    first, repair = await ledger(harness, probe["id"])
    budget = first.cost_usd + repair.reserved_usd - Decimal("0.000000001")
    assert budget >= first.reserved_usd
    data = await harness.run({**body("[[sim output=prose]]"),
                              "limits": {"budget_usd": str(budget)}})
    assert data["status"] == "failed" and data["error"]["code"] == "budget_exceeded"
    assert await calls(harness, data["id"]) == [("1", "ok", 200)]
    assert Decimal(data["usage"]["cost_usd"]) == first.cost_usd <= budget


async def test_a_pattern_that_explodes_when_backtracked_stalls_no_other_swarm(
        harness: Harness) -> None:
    """A caller's pattern and an answer it refuses, which a backtracking matcher takes
    minutes to refuse (2^32 ways to split the a's) with the loop held: matched in linear
    time, the answer fails `output_invalid` and the other swarm of the process ends."""
    evil = "a" * 32 + "b"
    r = await harness.post({
        "task": "t", "synthesis": {"strategy": "none"},
        "agents": [{"name": "reviewer", "prompt": f'[[sim answer="\\"{evil}\\""]]',
                    "output_schema": {"type": "string", "pattern": "^(a?){32}a{32}$"}}]})
    assert r.status_code == 202, r.text
    other = await harness.run(body())
    assert other["status"] == "succeeded", other["error"]
    data = await harness.wait(r.json()["id"])
    sub = only(data)
    assert sub["status"] == "failed" and sub["error"]["code"] == "output_invalid"
    assert f"(root): '{evil}' does not match" in sub["error"]["details"]["errors"][0]
