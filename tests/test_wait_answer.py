"""`GET /swarms/{id}?wait=` of a swarm that ends in this process answers from its runner's rows
(no read back), and that answer is the swarm as stored: the same as a plain GET afterwards."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.api import swarms
from tests.conftest import Harness

SLOW = "[[sim latency_ms=250]]"  # the swarm is still running when the reader starts waiting
POISON = "[[sim poison=1]]"  # answers with a NUL and a lone surrogate: stored sanitized

SHAPES: dict[str, dict[str, Any]] = {
    "synthesized": {"task": "t", "agents": [
        {"name": "a", "prompt": f"alpha {SLOW}"}, {"name": "b", "prompt": f"beta {SLOW}"},
        {"name": "c", "prompt": f"gamma {SLOW}", "depends_on": ["a", "b"]}]},
    "partly failed": {"task": "t", "limits": {"failure_tolerance": 0.5}, "agents": [
        {"name": "ok", "prompt": f"fine {SLOW}"},
        {"name": "bad", "prompt": f"[[sim fail=400]] {SLOW}"},
        {"name": "after", "prompt": f"x {SLOW}", "depends_on": ["bad"]}],
        "synthesis": {"strategy": "concatenate"}},
    "failed": {"task": "t", "agents": [{"name": "bad", "prompt": f"[[sim fail=400]] {SLOW}"}]},
    "sanitized": {"task": "t", "agents": [{"name": "p", "prompt": f"{POISON} {SLOW}"}],
                  "synthesis": {"strategy": "vote"}},
}


@pytest.mark.parametrize("shape", SHAPES)
async def test_the_waited_answer_is_the_stored_swarm_without_a_read(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    reads: list[str] = []
    read = swarms._read

    async def counted(session: Any, swarm_id: str, tenant: str) -> bytes:
        reads.append(swarm_id)
        return await read(session, swarm_id, tenant)

    monkeypatch.setattr(swarms, "_read", counted)
    created = (await harness.post(SHAPES[shape])).json()
    r = await harness.client.get(f"/swarms/{created['id']}", params={"wait": 20})
    assert r.status_code == 200
    waited = r.json()
    assert waited["status"] in ("succeeded", "failed")
    assert reads == []  # answered from the runner's rows
    await asyncio.sleep(0.05)
    stored = (await harness.client.get(f"/swarms/{created['id']}")).json()
    assert reads == [created["id"]]
    assert waited == stored
