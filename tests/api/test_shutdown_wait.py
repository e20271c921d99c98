"""A request held open when `serve` is told to stop — `GET /swarms/{id}?wait=`, a facade call
waiting for its swarm — is answered in the API's shape as the server drains (the swarm as it
is; a 503 the caller may retry), not cut by uvicorn's hard stop (a plain-text 500)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx

from tests.procs import cluster, post_swarm

BODY = {"task": "held", "agents": [{"name": "a"}]}
FACADE = {"model": "kimi-k2.5", "messages": [{"role": "user", "content": "held"}],
          "agent_swarm": {"enabled": True}}


async def test_waits_open_at_sigterm_are_answered_as_the_server_drains(
        db_url: str, tmp_path: Path) -> None:
    async with cluster(db_url, tmp_path, SWARM_SHUTDOWN_GRACE_S="5") as c:
        api = await c.api()  # no engine anywhere: the swarms stay queued
        swarm_id = (await post_swarm(api, BODY))["id"]
        async with httpx.AsyncClient(base_url=api, timeout=30) as client:
            wait = asyncio.create_task(client.get(f"/swarms/{swarm_id}", params={"wait": 60}))
            chat = asyncio.create_task(client.post("/v1/chat/completions", json=FACADE))
            await asyncio.sleep(1.0)  # both held
            assert not wait.done() and not chat.done()
            proc = next(p for p in c.procs if p.name == "api")
            sent = time.monotonic()
            proc.send(signal.SIGTERM)
            waited, chatted = await asyncio.gather(wait, chat)
            took = time.monotonic() - sent
        assert waited.status_code == 200, waited.text
        assert waited.json()["id"] == swarm_id and waited.json()["status"] == "queued"
        assert chatted.status_code == 503, chatted.text
        assert chatted.json()["error"]["code"] == "swarm_not_finished"
        assert took < 5, took  # a wake-up away, not uvicorn's grace + 5 s cut
        assert await proc.wait_exit(15) in (0, -signal.SIGTERM), proc.log()  # uvicorn re-raises it
        assert "Traceback" not in proc.log(), proc.log()
