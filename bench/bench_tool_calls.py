"""The tool path alone: a `ToolRegistry` in this process, waves of concurrent calls of a 50 ms
tool on the example MCP server over streamable HTTP and over stdio, this process's CPU per call
(user + system) and each wave's wall. No database, gateway or `serve`: what a call costs the
client, measurable on a loaded machine (CPU time moves far less with the load than wall time).
The collector is set as `serve` sets it (a higher threshold, the started process frozen).

    .venv/bin/python -m bench.bench_tool_calls [--calls 100] [--waves 20] [--sessions 8]

Another build's registry: run this file with that build's interpreter and its checkout first on
PYTHONPATH (`PYTHONPATH=/work/wt/base /work/wt/base/.venv/bin/python bench/bench_tool_calls.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from app.runtime import freeze_startup_objects, tune_gc
from app.tools.config import ServerConfig
from app.tools.registry import ToolRegistry
from bench.cpu import cpu_s
from tests.mcp_servers import HttpServer, stdio_server


def server_cpu_s(pid: int | None) -> float:
    """CPU seconds so far of the MCP server process `pid` (None: none known)."""
    return 0.0 if pid is None else cpu_s(pid)


async def waves(registry: ToolRegistry, server: str, calls: int, n: int,
                pid: int | None = None) -> tuple[float, float, list[str], float]:
    """(CPU ms per call, median wave wall s, failed calls' texts, the server process's CPU
    ms per call) over `n` waves of `calls` concurrent calls."""
    walls: list[float] = []
    failed: list[str] = []
    theirs = server_cpu_s(pid)
    cpu0 = time.process_time()
    for w in range(n):
        t0 = time.perf_counter()
        outcomes = await asyncio.gather(*(registry.call(server, "lookup", {"query": f"q{w}.{i}"})
                                          for i in range(calls)))
        walls.append(time.perf_counter() - t0)
        failed += [o.text for o in outcomes if o.status != "ok"]
    ours = (time.process_time() - cpu0) * 1000 / (calls * n)
    return (ours, statistics.median(walls), failed,
            (server_cpu_s(pid) - theirs) * 1000 / (calls * n))


def child_pids(pid: int) -> list[int]:
    """The direct children of process `pid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            out.append(int(stat.parent.name))
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--waves", type=int, default=20)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--tool-ms", type=float, default=50)
    args = ap.parse_args()
    tune_gc()  # the collector as `serve` sets it: what a call costs serve, not a bare process
    work = Path(tempfile.mkdtemp(prefix="bench-tool-calls-"))
    web = await asyncio.to_thread(HttpServer, work / "web.log", args.tool_ms)
    limits = {"max_concurrency": args.calls}
    registry = ToolRegistry({
        "web": ServerConfig(url=web.url, **limits),
        "docs": ServerConfig.model_validate(stdio_server(work / "docs.log", args.tool_ms,
                                                         **limits))},
        start_wait_s=120, http_sessions=args.sessions)
    try:
        await registry.start()
        for server in ("web", "docs"):
            await waves(registry, server, args.calls, 2)  # warm-up: sessions, connections
        freeze_startup_objects()  # as `serve` does once started
        children = [p for p in child_pids(os.getpid()) if p != web.popen.pid]
        pids = {"web": web.popen.pid, "docs": children[0] if len(children) == 1 else None}
        for server, transport in (("web", "http"), ("docs", "stdio")):
            cpu, wall, failed, theirs = await waves(registry, server, args.calls, args.waves,
                                                    pids[server])
            print(f"{transport}: {cpu:.3f} ms CPU per call (the server process "
                  f"{theirs:.3f} ms), wave of {args.calls} "
                  f"{wall * 1000:.0f} ms (median of {args.waves}; the tool takes "
                  f"{args.tool_ms:.0f} ms); {len(failed)} failed {failed[:1]}", flush=True)
    finally:
        await registry.stop()
        web.close()


if __name__ == "__main__":
    asyncio.run(main())
