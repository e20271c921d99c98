"""The creation rows of `make bench` (bench/bench_table.py): `POST /swarms` (1-agent swarms)
under 200 concurrent clients and from one client, each with httpx callers and aiohttp ones;
with the engine in the process, from API-only processes, split, and with every SPEC §8 quota
checked beside the same run without quotas (checked ÷ lifted)."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from pathlib import Path
from typing import Any

from bench.bench_create import drained, engine_worker, errors_cell, post_load
from bench.service import QUOTAS, serve_db, tenants_file
from tests.results_md import Row
from tests.support import free_port, process

Creation = tuple[dict[str, Any], dict[str, Any]]  # (under load, one client)
CLIENTS = ("httpx", "aiohttp")
# how long a `serve` may take to answer /readyz: two workers migrating and starting on a
# loaded 2-core machine take over 30 s
READY_S = 120


def load_size(quick: bool) -> tuple[int, int]:
    """(concurrent clients, swarms each) of a load."""
    return (50, 4) if quick else (200, 10)


async def creation(api: str, quick: bool, engine: bool, client: str) -> Creation:
    """Creation under load, then from one client (after the engine has run the load's
    swarms: one client on a quiet service, not behind a 2,000-swarm backlog)."""
    clients, each = load_size(quick)
    load = await post_load(api, clients, each, client=client)
    if engine:
        await drained(api)
    return load, await post_load(api, 1, 50 if quick else 200, client=client)


def under_load(r: dict[str, Any]) -> str:
    return (f"{r['per_s']:.0f}/s, p50 {r['p50'] * 1000:.0f} ms, p99 "
            f"{r['p99'] * 1000:.0f} ms, {errors_cell(r)}")


def creation_rows(got: dict[str, Creation], quick: bool, where: str) -> list[Row]:
    """The two creation rows, each figure with httpx callers (the issue's starting point) and
    aiohttp ones: a load generator taking a third of httpx's CPU per request from the two
    cores `serve` runs on."""
    clients, each = load_size(quick)
    return [Row(f"`POST /swarms` (1-agent), {clients} concurrent clients x {each}, {where}",
                f"httpx clients **{under_load(got['httpx'][0])}**; aiohttp clients "
                f"**{under_load(got['aiohttp'][0])}**", "-",
                ">= 500/s, p99 <= 0.6 s, 0 errors"),
            Row(f"`POST /swarms`, one client, {where}",
                f"httpx **p50 {got['httpx'][1]['p50'] * 1000:.1f} ms**; aiohttp **p50 "
                f"{got['aiohttp'][1]['p50'] * 1000:.1f} ms**", "-", "p50 <= 3 ms")]


def api_only_rows(env: dict[str, str], work: Path, cli: str, quick: bool) -> list[Row]:
    """The creation rows from API-only processes, each client kind on a database of its own:
    without an engine a load's 2,000 swarms stay queued, and the next one's queue positions
    would count them; then split, that process with a `swarm-api worker` running what it
    creates (a one-client caller then never has the previous swarm's engine work in its
    window)."""
    rows: list[Row] = []
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    for split, where in ((False, "API only (`serve --no-engine`)"),
                         (True, "split (`serve --no-engine` + `swarm-api worker`)")):
        got: dict[str, Creation] = {}
        name = "split" if split else "api2"
        for client in CLIENTS:
            with serve_db("swarm_bench") as db, contextlib.ExitStack() as stack:
                stack.enter_context(process(
                    ["serve", "--no-engine", "--port", str(port)], {**env, **db},
                    f"{api}/readyz", work / f"{name}-{client}.log", cli=cli,
                    ready_s=READY_S))
                if split:  # started once serve has migrated the database
                    stack.enter_context(engine_worker(
                        {**env, **db}, work / f"{name}-worker-{client}.log", cli))
                got[client] = asyncio.run(creation(api, quick, engine=split, client=client))
        rows.extend(creation_rows(got, quick, where))
    return rows


# per quota setup: each round's load, then one client
Pair = dict[str, tuple[list[dict[str, Any]], dict[str, Any]]]


def quota_pair(env: dict[str, str], work: Path, cli: str, quick: bool, runs: int,
               client: str) -> Pair:
    """Two `serve`s with their engines, each on a fresh database, up at once: one with the
    quotas lifted (BENCH_TENANTS), one with every SPEC §8 quota checked and none reached
    (CHECKED_TENANTS: what a tenant with the defaults pays for its admission and its calls'
    daily-cap reservations, without measuring the 600-a-minute bucket's 429s)."""
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        for quota, text in QUOTAS.items():
            db = stack.enter_context(serve_db("swarm_bench"))
            port = free_port()
            urls[quota] = f"http://127.0.0.1:{port}"
            stack.enter_context(process(
                ["serve", "--port", str(port)],
                {**env, **db, "SWARM_TENANTS_FILE": str(tenants_file(work, text))},
                f"{urls[quota]}/readyz", work / f"{quota}-{client}.log", cli=cli,
                ready_s=READY_S))
        return asyncio.run(pair_rounds(urls, quick, runs, client))


async def pair_rounds(urls: dict[str, str], quick: bool, runs: int, client: str) -> Pair:
    """`runs` loads on each, alternating which goes first, each drained before the next
    (one `serve` is idle while the other is measured); then one client on each."""
    clients, each = load_size(quick)
    for url in urls.values():  # warm-up: connections, caches, the first rows
        await post_load(url, 10, 5, client=client)
        await drained(url)
    loads: dict[str, list[dict[str, Any]]] = {q: [] for q in urls}
    for i in range(runs):
        for quota in (list(urls) if i % 2 == 0 else list(reversed(urls))):
            loads[quota].append(await post_load(urls[quota], clients, each, client=client))
            await drained(urls[quota])
    return {q: (loads[q], await post_load(urls[q], 1, 50 if quick else 200, client=client))
            for q in urls}


def quota_rows(pairs: dict[str, Pair], quick: bool, runs: int) -> list[Row]:
    """Checked ÷ lifted (the median of the rounds' ratios) with both p99s, per client kind;
    then the two quota-checked creation rows of the first table, from the checked `serve`'s
    median round."""
    clients, each = load_size(quick)

    def cell(pair: Pair) -> tuple[str, str]:
        checked, lifted = pair["checked"][0], pair["lifted"][0]
        ratios = [c["per_s"] / f["per_s"] for c, f in zip(checked, lifted, strict=True)]
        errors = sum(r["errors"] for r in checked + lifted)

        def side(loads: list[dict[str, Any]]) -> str:
            return (f"{statistics.median(r['per_s'] for r in loads):.0f}/s, p99 "
                    f"{statistics.median(r['p99'] for r in loads) * 1000:.0f} ms")

        return (f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f} to "
                f"{max(ratios):.2f}x; checked {side(checked)}; {errors} errors in both)",
                side(lifted))

    cells = {client: cell(pair) for client, pair in pairs.items()}
    ratio = Row(f"`POST /swarms` (1-agent), {clients} clients x {each}, engine in the process:"
                " every SPEC §8 quota checked (none reached) over the same without quotas, two"
                f" `serve`s on fresh databases, rounds alternating, median of {runs}",
                "; ".join(f"{c} {ours}" for c, (ours, _) in cells.items()),
                "without quotas: " + "; ".join(f"{c} {lifted}"
                                               for c, (_, lifted) in cells.items()),
                "checked/lifted >= 0.9x, checked p99 <= 0.5 s; lifted >= 800/s, p99 <= 0.4 s")

    def median_round(pair: Pair) -> Creation:
        loads, one = pair["checked"]
        return sorted(loads, key=lambda r: r["per_s"])[len(loads) // 2], one

    checked = {client: median_round(pair) for client, pair in pairs.items()}
    return [ratio, *creation_rows(checked, quick, "with the engine, every SPEC §8 quota "
                                  "checked (none reached)")]


async def engine_rows(api: str, quick: bool) -> list[Row]:
    """Creation on the table's own `serve` (after its engine rows): its engine runs what each
    load creates before the next, so no backlog carries over."""
    got = {client: await creation(api, quick, engine=True, client=client) for client in CLIENTS}
    return creation_rows(got, quick, "with the engine in the process")
