"""The facade's `response_format` with `agent_swarm` (SPEC §10, §15): the swarm's result is
asked of its synthesizer as that schema, parsed and repaired like any structured output."""

from __future__ import annotations

import json
from typing import Any

from tests.facade.conftest import Facade

TASK = [{"role": "user", "content": "Review the payment service"}]
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                                           "why": {"type": "string"}},
                          "required": ["ok", "why"], "additionalProperties": False}


async def _ask(facade: Facade, response_format: Any, **options: Any) -> Any:
    return await facade.http.post("/v1/chat/completions", json={
        "model": "kimi-k2.5", "messages": TASK, "response_format": response_format,
        "agent_swarm": {"enabled": True, "max_sub_agents": 2, **options}})


async def test_a_json_schema_response_format_shapes_the_result(facade: Facade) -> None:
    r = await _ask(facade, {"type": "json_schema",
                            "json_schema": {"name": "review", "schema": SCHEMA, "strict": True}})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    assert json.loads(content) == {"ok": True, "why": "xx"}
    swarm = await facade.swarm(r.json()["swarm_id"])
    assert swarm["spec"]["synthesis"]["output_schema"] == SCHEMA
    synth = next(s for s in swarm["subtasks"] if s["kind"] == "synthesizer")
    assert synth["output_status"] == "valid" and synth["output_format"] == "json_schema"


async def test_json_object_asks_for_an_object_and_text_for_nothing(
        facade_sqlite: Facade) -> None:
    r = await _ask(facade_sqlite, {"type": "json_object"})
    assert r.status_code == 200, r.text
    swarm = await facade_sqlite.swarm(r.json()["swarm_id"])
    assert swarm["spec"]["synthesis"]["output_schema"] == {"type": "object"}
    assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), dict)
    r = await _ask(facade_sqlite, {"type": "text"})
    assert r.status_code == 200, r.text
    swarm = await facade_sqlite.swarm(r.json()["swarm_id"])
    assert swarm["spec"]["synthesis"]["output_schema"] is None


async def test_a_bad_response_format_is_refused_naming_it(facade_sqlite: Facade) -> None:
    r = await _ask(facade_sqlite, {"type": "json_schema",
                                   "json_schema": {"name": "x", "schema": {"type": 7}}})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_schema" and err["param"] == "response_format.json_schema.schema"
    r = await _ask(facade_sqlite, {"type": "yaml"})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == "response_format"
    r = await _ask(facade_sqlite, {"type": "json_object"}, fan_in_strategy="concatenate")
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_schema"
