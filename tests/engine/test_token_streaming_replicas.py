"""Token streaming across processes (SPEC §10): the swarm runs on a worker, its facade client
reads an API replica, and the deltas cross through PostgreSQL (NOTIFY swarm_delta). The
first piece of a 2 s answer reaches the client within 100 ms of the gateway sending it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx

from tests.procs import cluster, sim_stats

BODY = {"model": "kimi-k2.5", "stream": True,
        "messages": [{"role": "user", "content": "Review it [[sim stream_ms=2000]]"}],
        "agent_swarm": {"enabled": True, "max_sub_agents": 2, "streaming": True,
                        "fan_in_strategy": "concatenate"}}


async def test_the_first_delta_crosses_replicas_within_100_ms(db_url: str,
                                                              tmp_path: Path) -> None:
    async with cluster(db_url, tmp_path) as c:
        sim = await c.simulator(latency_ms=20)
        api, _ = await asyncio.gather(c.api(), c.worker("worker"))
        first_at: float | None = None
        content: list[str] = []
        async with httpx.AsyncClient(timeout=60) as client, client.stream(
                "POST", f"{api}/v1/chat/completions", json=BODY) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                text = choices[0].get("delta", {}).get("content")
                if text and first_at is None and text.startswith("[SUB_AGENT_"):
                    first_at = time.time()
                if text:
                    content.append(text)
        stats = await sim_stats(sim)
    sent = [k["first_piece_at"] for k in stats["by_key"].values() if "first_piece_at" in k]
    assert len(sent) == 2 and first_at is not None  # both workers streamed
    print(f"first delta after the gateway sent it: {(first_at - min(sent)) * 1000:.1f} ms")
    assert 0 <= first_at - min(sent) < 0.1, first_at - min(sent)
    assert "".join(content).count("[/SUB_AGENT]") == 2
