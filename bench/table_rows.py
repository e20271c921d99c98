"""The engine rows of `make bench` (bench/bench_table.py), measured against one `serve`: the
100-agent fan-out beside bare gathers and LangGraph, throughput at 0 ms over a bare gather on
httpx and on aiohttp, the 1,000-agent swarm, 50 concurrent 100-agent swarms, and `serve`'s
memory (per in-flight call, and idle against after those swarms); each run alternating with
its peer, the median of the runs with their range. Also the swarm helpers other benchmarks
drive `serve` with (`swarm_body`, `run_swarm`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from tests.results_md import Row

ROOT = Path(__file__).resolve().parents[1]
BENCH_PY = ROOT / ".venv-bench" / "bin" / "python"
TERMINAL = ("succeeded", "failed", "cancelled")


def sim_agent(i: int, latency_ms: float) -> dict[str, Any]:
    return {"name": f"agent_{i}",
            "system_prompt": f"You are agent {i}. [[sim latency_ms={latency_ms:g}]]"}


def swarm_body(agents: int, latency_ms: float, synthesis: str, concurrency: int
               ) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": "benchmark", "agents": [sim_agent(i, latency_ms) for i in range(agents)],
        "synthesis": {"strategy": synthesis}, "max_tokens": 200,
        "limits": {"concurrency": concurrency, "deadline_s": 600}}
    if synthesis == "synthesize":
        # the synthesizer's own latency comes from the same directive in the task
        body["task"] = f"benchmark [[sim latency_ms={latency_ms:g}]]"
    return body


async def run_swarm(client: httpx.AsyncClient, body: dict[str, Any]) -> float:
    """POST → terminal seen through `?wait=`, as a caller sees it."""
    t0 = time.perf_counter()
    r = await client.post("/swarms", json=body)
    r.raise_for_status()
    swarm_id = r.json()["id"]
    while True:
        data = (await client.get(f"/swarms/{swarm_id}", params={"wait": 30})).json()
        if data["status"] in TERMINAL:
            break
    wall = time.perf_counter() - t0
    if data["status"] != "succeeded":
        raise RuntimeError(f"swarm {swarm_id} {data['status']}: {data['error']}")
    return wall


async def bare_gather(sim: str, calls: int, in_flight: int, latency_ms: float,
                      synthesis: bool, *, on_aiohttp: bool = False) -> float:
    """The hand-written script: one client (one pool), a semaphore, asyncio.gather. On httpx
    as the issue's peer; `on_aiohttp` the same script over one aiohttp session (the service's
    own gateway client underneath): what any client gets from this simulator on this machine."""
    directive = f"[[sim latency_ms={latency_ms:g}]]"
    url = f"{sim}/chat/completions"
    async with contextlib.AsyncExitStack() as stack:
        if on_aiohttp:
            session = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=in_flight)))

            async def post(body: dict[str, Any]) -> Any:
                async with session.post(url, json=body) as r:
                    r.raise_for_status()
                    return await r.json()
        else:
            limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
            c = await stack.enter_async_context(httpx.AsyncClient(limits=limits, timeout=120))

            async def post(body: dict[str, Any]) -> Any:
                r = await c.post(url, json=body)
                r.raise_for_status()
                return r.json()

        gate = asyncio.Semaphore(in_flight)

        async def one(system: str) -> str:
            async with gate:
                answer = await post({
                    "model": "kimi-k2.5", "max_tokens": 200,
                    "messages": [{"role": "system", "content": f"{system} {directive}"},
                                 {"role": "user", "content": "benchmark"}]})
                return str(answer["choices"][0]["message"]["content"])

        await one("warm-up")
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(one(f"You are agent {i}.") for i in range(calls)))
        if synthesis:
            await one("merge " + " ".join(outs)[:2000])
        return time.perf_counter() - t0


def langgraph_walls(sim: str, agents: int, latency_ms: float, runs: int) -> list[float] | None:
    if not BENCH_PY.exists():
        return None
    out = subprocess.run([str(BENCH_PY), str(ROOT / "bench" / "peer_langgraph.py"), sim,
                          str(agents), f"{latency_ms:g}", str(runs)],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:  # the peer's failure is its own: the table goes on without it
        print(f"LangGraph peer failed ({out.returncode}):\n{out.stderr[-2000:]}",
              file=sys.stderr)
        return None
    walls: list[float] = json.loads(out.stdout.strip().splitlines()[-1])["walls"]
    return walls


class RssSampler:
    """Peak RSS of a process, sampled every 10 ms from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.01)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def measure(api: str, sim: str, serve_pid: int, runs: int, quick: bool) -> list[Row]:
    rows: list[Row] = []
    idle_rss = RssSampler(serve_pid).rss()  # before any swarm: what `serve` starts with
    async with httpx.AsyncClient(base_url=api, timeout=120) as c:
        rows.append(await fanout_row(c, sim, runs))
        rows += await throughput_rows(c, sim, runs, quick)

        # one 1,000-agent swarm at 200 ms, 256 in flight; memory per in-flight call
        n = 300 if quick else 1000
        floor = n / 256 * 0.2
        idle = RssSampler(serve_pid).rss()
        walls: list[float] = []
        # the same calls from a script that persists nothing: what this simulator and machine
        # allow any client (no target of the issue's; context for ours)
        bare_walls: list[float] = []
        with RssSampler(serve_pid) as sampler:
            for _ in range(runs):
                walls.append(await run_swarm(c, swarm_body(n, 200, "none", 256)) / floor)
                bare_walls.append(await bare_gather(sim, n, 256, 200, False, on_aiohttp=True)
                                  / floor)
        per_call_kb = (sampler.peak - idle) / 256 / 1024
        rows.append(Row(f"one {n}-agent swarm at 200 ms, 256 in flight: wall over floor "
                        f"({n} / 256 x 0.2 s), median of {runs}",
                        f"**{statistics.median(walls):.2f}x** ({spread(walls, 'x')})",
                        f"bare gather on aiohttp {statistics.median(bare_walls):.2f}x",
                        "<= 1.25x (issue 14: <= 1.5x)"))
        rows.append(Row("memory of `serve` per in-flight call (peak - idle RSS) over 256",
                        f"**{per_call_kb:.0f} KB** (idle {idle / 2**20:.0f} MB, peak "
                        f"{sampler.peak / 2**20:.0f} MB)", "-", "< 50 KB"))

        # 50 concurrent 100-agent swarms at 200 ms, and what `serve` holds after them
        swarms, many_walls, after, peer = await many_swarms(c, quick, runs, serve_pid, sim)
        rows.append(many_swarms_row(swarms, many_walls, "", "<= 1.05x (issue 14: <= 1.5x)",
                                    peer))
        rows.append(rss_row(idle_rss, after, swarms, n))
    return rows


async def fanout_row(c: httpx.AsyncClient, sim: str, runs: int) -> Row:
    """100 agents + synthesis at 500 ms over the floor (2 x 500 ms), beside bare gathers on
    httpx and aiohttp and LangGraph `Send`."""
    body = swarm_body(100, 500, "synthesize", 100)
    await run_swarm(c, body)  # warm process: connections, caches
    # the three alternate, run by run: the machine's speed drifts over a minute
    ours: list[float] = []
    bare: list[float] = []
    bare_aio: list[float] = []
    for _ in range(runs):
        ours.append(await run_swarm(c, body))
        bare.append(await bare_gather(sim, 100, 100, 500, True))
        bare_aio.append(await bare_gather(sim, 100, 100, 500, True, on_aiohttp=True))
    lg = langgraph_walls(sim, 100, 500, runs)
    lg_cell = (f"{statistics.median(lg):.3f}" if lg
               else "not measured (failed or not installed: see stderr)")
    # what persistence, retries and budgets add over the fastest hand-written script
    gap_ms = (statistics.median(ours) - statistics.median(bare_aio)) * 1000
    return Row(f"100-agent fan-out + synthesis at 500 ms, over floor (2 x 500 ms), median of "
               f"{runs}", f"**{statistics.median(ours):.3f}** ({spread(ours, '')})",
               f"bare gather {statistics.median(bare):.3f} (the same on aiohttp "
               f"{statistics.median(bare_aio):.3f}: swarm-api {gap_ms:+.0f} ms over it); "
               f"LangGraph `Send` {lg_cell}", "<= 1.03 (issue 14: <= 1.05)")


async def throughput_rows(c: httpx.AsyncClient, sim: str, runs: int, quick: bool) -> list[Row]:
    """Throughput at 0 ms, 64 in flight: `runs` trios, ours and the two bare gathers
    alternating (one pair moved +-25 % between runs on a 2-core machine; the median of the
    trios' ratios is the figure). Over the httpx gather (the first table's peer) and over the
    aiohttp one (issue 53's: the fastest bare client on this machine)."""
    n = 300 if quick else 1000
    body = swarm_body(n, 0, "none", 64)
    trios = [(n / await run_swarm(c, body), n / await bare_gather(sim, n, 64, 0, False),
              n / await bare_gather(sim, n, 64, 0, False, on_aiohttp=True))
             for _ in range(runs)]
    ratios = [ours / bare for ours, bare, _ in trios]
    aio_ratios = [ours / aio for ours, _, aio in trios]
    ours_s, httpx_s, aio_s = (statistics.median(t[i] for t in trios) for i in range(3))
    what = f"throughput at 0 ms, 64 in flight ({n} subtasks): persisted subtasks/s over"
    return [Row(f"{what} a bare single-pool gather on httpx, median of {runs}",
                f"**{statistics.median(ratios):.2f}x** ({spread(ratios, 'x')}; "
                f"{ours_s:.0f}/s)", f"bare httpx gather {httpx_s:.0f}/s", ">= 3x"),
            Row(f"{what} a bare gather on aiohttp (persisting nothing), median of {runs}",
                f"**{statistics.median(aio_ratios):.2f}x** ({spread(aio_ratios, 'x')}; "
                f"{ours_s:.0f}/s)", f"bare aiohttp gather {aio_s:.0f}/s", ">= 0.5x")]


async def many_swarms(c: httpx.AsyncClient, quick: bool, runs: int, pid: int | None = None,
                      sim: str | None = None
                      ) -> tuple[int, list[float], list[int], list[float]]:
    """`runs` rounds of 50 concurrent 100-agent swarms at 200 ms: (swarms a round, each
    round's wall over its floor, `pid`'s RSS after each round when given, and with `sim` the
    same calls from a bare aiohttp gather after each round, over the same floor)."""
    swarms = 10 if quick else 50
    floor = swarms * 100 / 256 * 0.2
    walls: list[float] = []
    rss: list[int] = []
    bare: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await asyncio.gather(*(run_swarm(c, swarm_body(100, 200, "none", 100))
                               for _ in range(swarms)))
        walls.append((time.perf_counter() - t0) / floor)
        if pid is not None:
            rss.append(RssSampler(pid).rss())
        if sim is not None:
            bare.append(await bare_gather(sim, swarms * 100, 256, 200, False, on_aiohttp=True)
                        / floor)
    return swarms, walls, rss, bare


def many_swarms_row(swarms: int, walls: list[float], where: str, target: str,
                    bare: list[float] | None = None) -> Row:
    peer = f"bare gather on aiohttp {statistics.median(bare):.2f}x" if bare else "-"
    return Row(f"{swarms} concurrent 100-agent swarms at 200 ms{where}: wall over floor "
               f"({swarms * 100} / 256 x 0.2 s), median of {len(walls)}",
               f"**{statistics.median(walls):.2f}x** ({spread(walls, 'x')})", peer, target)


def rss_row(idle: int, after: list[int], swarms: int, wide: int) -> Row:
    """`serve`'s RSS at start against after the wide swarms and the many-swarm rounds, and
    what it holds per finished swarm: the growth from the first round's end to the last's
    over the swarms finished between (a leak grows with them; a cache or a pool does not)."""
    held = ("-" if len(after) < 2 else
            f"{(after[-1] - after[0]) / ((len(after) - 1) * swarms) / 1024:.1f} KB")
    return Row(f"`serve`'s RSS, idle -> after the {wide}-agent swarms and {len(after)} rounds "
               f"of {swarms} x 100; held per finished swarm (the growth over the rounds after "
               "the first)", f"**{idle / 2**20:.0f} -> {after[-1] / 2**20:.0f} MB**; "
               f"**{held}** per finished swarm", "-", "flat per finished swarm")


def spread(values: list[float], unit: str) -> str:
    """The range of a row's runs, so a reader sees how far one run moves."""
    return f"{min(values):.2f} to {max(values):.2f}{unit}"


async def workers_row(api: str, quick: bool, runs: int) -> Row:
    """The many-swarm row again from `serve --workers 2` (two engines, 128 calls in flight
    each)."""
    async with httpx.AsyncClient(base_url=api, timeout=120) as c:
        await run_swarm(c, swarm_body(100, 0, "none", 100))  # warm both workers' pools
        swarms, walls, _, _ = await many_swarms(c, quick, runs)
    return many_swarms_row(swarms, walls, ", `serve --workers 2` (128 in flight each)",
                           "<= 1.5x")
