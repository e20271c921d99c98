"""The approval gate through the typed clients and the CLI (`swarm-api approve ID [--plan FILE]`,
`swarm-api reject ID`), against a real `swarm-api serve` on PostgreSQL; the facade's
`agent_swarm.approval` (202 with the held swarm's id) on both databases."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarm_api_client import AsyncSwarmClient, SwarmClient
from swarm_api_client.errors import Conflict
from tests.client_support import API_KEY, SERVICE_ENV, cli
from tests.conftest import Harness
from tests.procs import live_service

HELD = {"task": "held for review", "limits": {"approval": "always"},
        "agents": [{"name": "first", "prompt": "one"}, {"name": "second", "prompt": "two"}]}


@pytest.fixture(scope="module")
def api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_service(tmp_path_factory.mktemp("approval"), **SERVICE_ENV) as url:
        yield url


@pytest.mark.postgres
def test_client_approve_and_reject(api_url: str) -> None:
    with SwarmClient(api_url, api_key=API_KEY) as client:
        swarm = client.create(HELD)
        assert swarm.status == "awaiting_approval" and swarm.plan and swarm.estimate
        approved = client.approve(swarm.id, agents=[{"name": "only", "prompt": "just this"}])
        assert [a["name"] for a in approved.plan["agents"]] == ["only"]  # type: ignore[index]
        done = client.wait(swarm.id, timeout=60)
        assert done.status == "succeeded"
        assert [s.name for s in done.subtasks] == ["only", "@synthesizer"]
        with pytest.raises(Conflict) as refused:
            client.approve(swarm.id)
        assert refused.value.code == "not_awaiting_approval"
        other = client.create(HELD)
        rejected = client.reject(other.id, reason="not today")
        assert rejected.status == "cancelled" and rejected.error
        assert rejected.error["code"] == "rejected"


@pytest.mark.postgres
async def test_async_client_approve_and_reject(api_url: str) -> None:
    async with AsyncSwarmClient(api_url, api_key=API_KEY) as client:
        swarm = await client.create(HELD)
        assert (await client.approve(swarm.id)).status != "awaiting_approval"
        assert (await client.wait(swarm.id, timeout=60)).status == "succeeded"
        other = await client.create(HELD)
        assert (await client.reject(other.id)).error["code"] == "rejected"  # type: ignore[index]


@pytest.mark.postgres
def test_cli_approve_with_a_plan_file_and_reject(api_url: str, tmp_path: Path) -> None:
    with SwarmClient(api_url, api_key=API_KEY) as client:
        swarm = client.create(HELD)
        listed = cli(api_url, "ls", "--status", "awaiting_approval")
        assert listed.returncode == 0 and swarm.id in listed.stdout
        shown = json.loads(cli(api_url, "get", swarm.id, "--json").stdout)
        plan: dict[str, Any] = shown["plan"]
        plan["agents"] = plan["agents"][:1]  # the reviewer keeps one agent
        path = tmp_path / "plan.json"
        path.write_text(json.dumps(plan))
        done = cli(api_url, "approve", swarm.id, "--plan", str(path), "--wait")
        assert done.returncode == 0, done.stderr
        final = client.get(swarm.id)
        assert [s.name for s in final.subtasks] == ["first", "@synthesizer"]
        again = cli(api_url, "approve", swarm.id)
        assert again.returncode == 2 and "not_awaiting_approval" in again.stderr

        bad = client.create(HELD)
        path.write_text(json.dumps({"agents": [{"name": "x", "depends_on": ["y"]}]}))
        refused = cli(api_url, "approve", bad.id, "--plan", str(path))
        assert refused.returncode == 2 and "depends_on" in refused.stderr
        path.write_text('"not a plan"')
        assert cli(api_url, "approve", bad.id, "--plan", str(path)).returncode == 2
        rejected = cli(api_url, "reject", bad.id, "--reason", "no")
        assert rejected.returncode == 0, rejected.stderr
        assert rejected.stdout.split() == [bad.id, "cancelled"]
        error = client.get(bad.id).error or {}
        assert (error["code"], error["message"]) == ("rejected", "no")


async def test_the_facade_answers_202_for_a_held_swarm(harness: Harness) -> None:
    r = await harness.client.post("/v1/chat/completions", json={
        "model": "kimi-k2.5", "messages": [{"role": "user", "content": "plan a trip"}],
        "agent_swarm": {"enabled": True, "approval": "always"}})
    assert r.status_code == 202, r.text
    answer = r.json()
    assert answer["swarm_status"] == "awaiting_approval"
    assert answer["choices"][0]["message"]["content"] == ""
    swarm = (await harness.client.get(f"/swarms/{answer['swarm_id']}")).json()
    assert swarm["status"] == "awaiting_approval" and swarm["plan"]["agents"]
    assert answer["id"] == f"chatcmpl-{swarm['id']}"
    # a rule the plan passes: the answer is the completion as ever
    r = await harness.client.post("/v1/chat/completions", json={
        "model": "kimi-k2.5", "messages": [{"role": "user", "content": "plan a trip"}],
        "agent_swarm": {"enabled": True, "approval": {"above_agents": 500}}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    bad = await harness.client.post("/v1/chat/completions", json={
        "model": "kimi-k2.5", "messages": [{"role": "user", "content": "x"}],
        "agent_swarm": {"enabled": True, "approval": "sometimes"}})
    assert bad.status_code in (400, 422), bad.text
