"""A stdio tool server that dies is restarting, not gone (SPEC §9): a swarm naming it while it
restarts is accepted and its calls wait for the restarted server; a server that never came up
is still refused. A real example server process, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from tests.conftest import make_settings, start_harness
from tests.helpers import until
from tests.mcp_servers import calls, stdio_server, write_config


async def test_a_swarm_naming_a_restarting_server_is_accepted_and_served(
        database_url: str, tmp_path: Path) -> None:
    log = tmp_path / "docs.log"
    config = write_config(tmp_path / "mcp.json", {
        "docs": stdio_server(log, timeout_s=60),
        "never": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]},
    })
    h, close = await start_harness(make_settings(database_url, mcp_config=config))
    try:
        body = {"task": "t", "synthesis": {"strategy": "none"}, "agents": [
            {"name": "a", "tools": ["docs.lookup"], "prompt": "before [[sim latency_ms=0]]"}]}
        done = await h.run(body, timeout=60)
        assert done["status"] == "succeeded", done["error"]
        docs = h.app.state.tools.connections["docs"]
        (pid,) = {e["pid"] for e in calls(log)}
        os.kill(pid, signal.SIGKILL)
        await until(lambda: docs.state != "up", 30, "the supervisor to see the server die")
        body["agents"][0]["prompt"] = "after [[sim latency_ms=0]]"  # type: ignore[index]
        r = await h.post(body)
        assert r.status_code == 202, r.text  # restarting: accepted, not 422
        done = await h.wait(r.json()["id"], timeout=90)
        assert done["status"] == "succeeded", done["error"]
        detail = (await h.client.get(f"/swarms/{done['id']}/subtasks/a")).json()
        tool = [m["content"] for m in detail["transcript"] if m["role"] == "tool"]
        assert len(tool) == 1 and tool[0].startswith("lookup 'after"), tool  # served, not failed
        assert docs.restarts >= 1 and len({e["pid"] for e in calls(log)}) == 2

        # a server that never came up is not restarting: refused as before
        r = await h.post({"task": "t", "agents": [{"name": "b", "tools": ["never"]}]})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "tool_server_unavailable"
    finally:
        await close()
