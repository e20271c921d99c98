"""The pure parts of tools (SPEC §9): the config file, selectors, the result cut, the plan's
tools, the critical-path priority, the simulator's tool turns and the reservation bound."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine import dag
from app.engine.context import estimate_request_tokens
from app.engine.planner import PlanInvalid, parse_plan, tool_allowed
from app.engine.turns import CALL_ID_MAX, ledger_ids, openai_tools
from app.gateway.chat import ToolCallRequest
from app.simulator.tools import arguments, final_answer, tool_calls, turns_done
from app.tools.config import load_config
from app.tools.model import ToolInfo
from app.tools.registry import cut, split_selector


def test_config_reads_the_shared_shape_and_refuses_what_cannot_run(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {
        "search": {"command": "python", "args": ["-m", "s"], "env": {"K": "v"},
                   "max_concurrency": 10, "tool_concurrency": {"web_search": 4}, "timeout_s": 5},
        "docs": {"url": "https://docs.internal/mcp", "headers": {"Authorization": "Bearer x"}}},
        "otherClientKey": 1}))
    servers = load_config(path)
    assert (servers["search"].transport, servers["docs"].transport) == ("stdio", "http")
    assert servers["search"].tool_concurrency == {"web_search": 4}
    assert servers["docs"].max_concurrency == 8 and servers["docs"].timeout_s == 30
    for bad in ({"a__b": {"command": "x"}}, {"a.b": {"command": "x"}},
                {"a": {"command": "x", "url": "http://y"}}, {"a": {}},
                {"a": {"command": "x", "max_concurrency": 0}}, {"a": {"command": "x", "z": 1}}):
        path.write_text(json.dumps({"mcpServers": bad}))
        with pytest.raises(ValueError, match="SWARM_MCP_CONFIG"):
            load_config(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="SWARM_MCP_CONFIG"):
        load_config(path)


def test_selectors_and_what_a_plan_may_hand_out() -> None:
    assert split_selector("docs") == ("docs", None)
    assert split_selector("docs.read.v2") == ("docs", "read.v2")
    assert tool_allowed("docs.read", ["docs"]) and tool_allowed("docs.read", ["docs.read"])
    assert not tool_allowed("docs", ["docs.read"]) and not tool_allowed("web.x", ["docs"])
    plan = json.dumps({"subtasks": [{"id": "a", "description": "d", "tools": ["docs.read"]}]})
    assert parse_plan(plan, "stop", 5, 3, ["docs"])[0].tools == ("docs.read",)
    with pytest.raises(PlanInvalid) as bad:
        parse_plan(plan, "stop", 5, 3, ["web"])
    assert bad.value.reason == "unknown_tool"
    with pytest.raises(PlanInvalid):
        parse_plan(plan.replace('["docs.read"]', '"docs.read"'), "stop", 5, 3, ["docs"])


@given(st.text(max_size=300), st.integers(1, 200))
def test_a_cut_result_fits_and_says_what_was_cut(text: str, limit: int) -> None:
    out = cut(text, limit)
    size = len(text.encode())
    if size <= limit:
        assert out == text
    else:
        kept, marker = out.rsplit("\n[truncated: ", 1)
        assert text.startswith(kept) and len(kept.encode()) <= limit
        assert marker == f"{size - len(kept.encode())} of {size} bytes omitted]"


def test_critical_path_priority_counts_the_chain_below() -> None:
    deps = {"a": [], "b": ["a"], "c": ["b"], "d": ["a"], "e": []}
    assert dag.chain_below(deps) == {"a": 3, "b": 2, "c": 1, "d": 1, "e": 1}


def test_simulated_tool_turns_are_valid_then_quote_every_result() -> None:
    schema = {"type": "object", "required": ["query", "n", "mode", "flag"], "properties": {
        "query": {"type": "string"}, "n": {"type": "integer", "minimum": 3},
        "mode": {"type": "string", "enum": ["fast", "slow"]}, "flag": {"type": "boolean"},
        "path": {"type": "string", "default": "x"}}}
    assert arguments(schema, "topic") == {"query": "topic", "n": 3, "mode": "fast",
                                          "flag": False}
    calls = tool_calls([("docs__lookup", schema), ("web__read", {})], "topic", 2, "nope")
    assert [c["function"]["name"] for c in calls] == ["docs__lookup", "web__read"]
    assert json.loads(calls[0]["function"]["arguments"])["query"] == "topic #2"
    first = tool_calls([("docs__lookup", schema)], "topic", 1, "nope")
    assert [c["function"]["name"] for c in first] == ["docs__lookup", "nope"]
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": first},
                {"role": "tool", "tool_call_id": first[0]["id"], "content": "result one"},
                {"role": "tool", "tool_call_id": first[1]["id"], "content": "error: nope"}]
    assert turns_done(messages) == 1
    answer = final_answer(messages)
    assert "result one" in answer and "error: nope" in answer


@given(st.lists(st.text(max_size=200), min_size=1, max_size=6))
def test_the_reservation_bound_covers_what_the_simulator_bills(texts: list[str]) -> None:
    messages = [{"role": "user" if i % 2 else "tool", "content": t, "tool_call_id": "c"}
                for i, t in enumerate(texts)]
    tools = openai_tools([ToolInfo("docs", "lookup", "d", {"type": "object"})])
    billed = math.ceil(sum(len(t) for t in texts) / 4) + 4 * len(texts)  # simulator/responses.py
    assert estimate_request_tokens(messages, tools) >= billed


@given(st.lists(st.sampled_from(["dup", "dup#1", "dup#4", "a", "L" * 200 + "x", "L" * 200 + "y",
                                 "L" * 126 + "#2", "L" * 129]), max_size=12))
def test_every_call_of_a_turn_gets_its_own_ledger_id(ids: list[str]) -> None:
    """Repeated ids and ids equal in their first 128 characters: one distinct id each, the
    same on every run (a takeover meets its committed rows), the model's own when it can."""
    calls = [ToolCallRequest(i, "s__t", "{}") for i in ids]
    out = ledger_ids(calls)
    assert len(set(out)) == len(ids) and all(len(i) <= CALL_ID_MAX for i in out)
    assert ledger_ids(list(calls)) == out
    for given_id, stored in zip(ids, out, strict=True):
        if ids.count(given_id) == 1 and len(given_id) <= CALL_ID_MAX:
            assert stored == given_id
    assert ledger_ids([ToolCallRequest("dup", "s__t", "{}")] * 3) == ["dup#0", "dup#1", "dup#2"]
