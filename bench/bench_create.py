"""Creation: `POST /swarms` (1-agent swarms) under many concurrent clients and from one client,
with the engine in the process, without (`serve --no-engine`), and split (`serve --no-engine`
with a `swarm-api worker` beside it running the swarms), optionally for several builds
of `swarm-api` back to back (an A/B in one run on a noisy machine), optionally profiled.

    .venv/bin/python -m bench.bench_create [--clients 200] [--each 10] [--single 200]
        [--cli base=/path/to/old/.venv/bin/swarm-api] [--cli new=.venv/bin/swarm-api]
        [--modes engine,api,split] [--rounds 1] [--workers 1,2] [--profile DIR]
        [--client httpx,aiohttp] [--quotas lifted,checked]

Every (build, mode) gets its own throwaway PostgreSQL database and `serve` process, started and
stopped in turn (never two at once), with `BENCH_TENANTS` as SWARM_TENANTS_FILE (SPEC §8's
rate, active-swarm and daily limits lifted: a 429 would measure the token bucket, not the API;
`--checked`: every key set but none reached, so each request pays for the quota checks;
`--quotas lifted,checked`: each build with both, in alternating order by round, and each
build's checked ÷ lifted throughput printed, the ratio issue 53 sets a goal for).
Errors are counted by kind: an HTTP status other than 202, or the client's exception. The
load generator runs on the same two cores as `serve` and PostgreSQL: `--client aiohttp` takes
less of them than httpx (each client in its own `serve`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.builds import add_builds
from bench.builds import builds as bench_builds
from bench.cpu import cpu_s, postgres_cpu_s
from bench.profiles import profiled, top_frames
from bench.service import BENCH_TENANTS, CHECKED_TENANTS, CLI, QUOTAS, serve_db, tenants_file
from tests.support import free_port, process, wait_http

BODY: dict[str, Any] = {"task": "benchmark", "agents": [
    {"name": "agent_0", "system_prompt": "You are agent 0. [[sim latency_ms=0]]"}],
    "synthesis": {"strategy": "none"}, "max_tokens": 200,
    "limits": {"concurrency": 1, "deadline_s": 600}}


async def post_load(api: str, clients: int, each: int,
                    body: dict[str, Any] | None = None, client: str = "httpx",
                    keyed: bool = False) -> dict[str, Any]:
    """`clients` concurrent callers (one connection each), each POSTing `each` swarms in a
    row: creations/s, p50/p99 latency, and the errors by kind. `client="aiohttp"`: the
    callers on aiohttp, a load generator that takes less of this machine's two cores from
    the `serve` it measures (httpx takes several times aiohttp's CPU per request)."""
    lat: list[float] = []
    errors: Counter[str] = Counter()
    body = body or BODY
    # one TLS context for every caller: httpx builds one per client otherwise (~15 ms of CPU
    # each, even for http://), which put 3 s of the load generator's start-up in the p99
    tls = httpx.create_ssl_context()

    def headers() -> dict[str, str]:  # `keyed`: a fresh Idempotency-Key, as the typed client
        return {"Idempotency-Key": uuid.uuid4().hex} if keyed else {}

    async def caller() -> None:
        async with httpx.AsyncClient(base_url=api, timeout=60, verify=tls) as c:
            for _ in range(each):
                t0 = time.perf_counter()
                try:
                    r = await c.post("/swarms", json=body, headers=headers())
                    if r.status_code != 202:
                        errors[f"HTTP {r.status_code}"] += 1
                except httpx.HTTPError as exc:
                    errors[type(exc).__name__] += 1
                lat.append(time.perf_counter() - t0)

    async def aiohttp_caller() -> None:
        connector = aiohttp.TCPConnector(limit=1)  # one connection, as each httpx caller
        async with aiohttp.ClientSession(api, connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=60)) as c:
            for _ in range(each):
                t0 = time.perf_counter()
                try:
                    async with c.post("/swarms", json=body, headers=headers()) as r:
                        await r.read()
                        if r.status != 202:
                            errors[f"HTTP {r.status}"] += 1
                except (aiohttp.ClientError, TimeoutError) as exc:
                    errors[type(exc).__name__] += 1
                lat.append(time.perf_counter() - t0)

    one = {"httpx": caller, "aiohttp": aiohttp_caller}[client]
    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one() for _ in range(clients)))
    wall = time.perf_counter() - t0
    lat.sort()
    return {"per_s": clients * each / wall, "p50": lat[len(lat) // 2],
            "client_cpu_ms": (time.process_time() - cpu0) * 1000 / (clients * each),
            "p99": lat[max(int(len(lat) * 0.99) - 1, 0)], "errors": sum(errors.values()),
            "kinds": dict(errors)}


async def drained(api: str, timeout_s: float = 300.0) -> float:
    """Wait until `serve`'s engine has run every swarm the load created (none queued or
    running): one client's latency is then measured on a quiet service, not against the
    backlog of a 2,000-swarm burst (its engine runs ~300 1-agent swarms a second). Returns
    the seconds waited."""
    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=api, timeout=30) as c:
        for status in ("queued", "planning", "running", "synthesizing"):
            while (await c.get("/swarms", params={"status": status, "limit": 1})
                   ).json()["items"]:
                if time.perf_counter() - t0 > timeout_s:
                    raise TimeoutError(f"swarms still {status} after {timeout_s:.0f} s")
                await asyncio.sleep(0.1)
    return time.perf_counter() - t0


def errors_cell(result: dict[str, Any]) -> str:
    if not result["errors"]:
        return "0 errors"
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(result["kinds"].items(),
                                                    key=lambda kv: -kv[1]))
    return f"{result['errors']} errors ({kinds})"


async def measure(url: str, clients: int, each: int, single: int, pids: list[int],
                  profile: Path | None, engine: bool, client: str = "httpx",
                  keyed: bool = False) -> dict[str, dict[str, Any]]:
    """`pids`: the processes whose CPU a request is charged (serve's, and a worker's); the
    first is the one profiled."""
    def cpu() -> float:
        return sum(cpu_s(p) for p in pids)

    await post_load(url, 10, 5, client=client, keyed=keyed)  # warm-up: connections, caches
    with profiled(pids[0], profile and profile.with_suffix(".load.raw")):
        c0, db0 = cpu(), postgres_cpu_s()
        load = await post_load(url, clients, each, client=client, keyed=keyed)
        load["cpu_ms"] = (cpu() - c0) * 1000 / (clients * each)
        load["db_cpu_ms"] = (postgres_cpu_s() - db0) * 1000 / (clients * each)
    if engine:
        load["drained_s"] = await drained(url)
    with profiled(pids[0], profile and profile.with_suffix(".single.raw")):
        c0 = cpu()
        one = await post_load(url, 1, single, client=client, keyed=keyed)
        one["cpu_ms"] = (cpu() - c0) * 1000 / single
    return {"load": load, "single": one}


@contextlib.contextmanager
def engine_worker(env: dict[str, str], log: Path, cli: str = CLI
                  ) -> Iterator[subprocess.Popen[bytes]]:
    """A `swarm-api worker` (the engine alone) beside an API-only `serve` on the same
    database, as a split deployment runs it: ready once its metrics port answers."""
    port = free_port()
    with process(["worker"], {**env, "SWARM_METRICS_PORT": str(port)},
                 f"http://127.0.0.1:{port}/metrics", log, cli=cli, ready_s=60) as proc:
        yield proc


def run(label: str, cli: str, mode: str, args: argparse.Namespace,
        work: Path, client: str = "httpx") -> dict[str, dict[str, Any]]:
    """One (build, mode): `engine` is one `serve` with its engine, `api` one `serve
    --no-engine` (its swarms stay queued), `split` a `serve --no-engine` with a `swarm-api
    worker` running what it creates (the worker's CPU counted with serve's)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    extra = ["--no-engine"] if mode in ("api", "split") else []
    workers = label.partition("/w")[2].partition("/")[0]
    quota = label.rpartition("/")[2]  # "main/checked": `--quotas`' tenants file
    label = label.replace("/", "-")  # a file name below
    if workers:
        extra += ["--workers", workers]
    with serve_db("swarm_bench") as db, contextlib.ExitStack() as stack:
        tenants = tenants_file(work, QUOTAS.get(quota)
                               or (CHECKED_TENANTS if args.checked else BENCH_TENANTS))
        env = {**db, "SWARM_GATEWAY_URL": args.sim,
               "SWARM_TENANTS_FILE": str(tenants), "SWARM_MAX_INFLIGHT": "256",
               "SWARM_MAX_RUNNING_SWARMS": "64"}
        proc = stack.enter_context(process(["serve", "--port", str(port), *extra], env,
                                           f"{url}/readyz", work / f"{label}-{mode}.log",
                                           cli=cli, ready_s=60))
        pids = [proc.pid]
        if mode == "split":  # started once serve has migrated the database
            pids.append(stack.enter_context(engine_worker(
                env, work / f"{label}-{mode}-worker.log", cli)).pid)
        prof = Path(args.profile) / f"{label}-{mode}-{client}" if args.profile else None
        return asyncio.run(measure(url, args.clients, args.each, args.single, pids,
                                   prof, engine=mode != "api", client=client,
                                   keyed=args.keyed))


def quota_ratios(got: dict[tuple[str, str], list[dict[str, dict[str, Any]]]]) -> str:
    """Each build's checked ÷ lifted load throughput, round by round and their median."""
    lines = []
    for (label, mode), runs in got.items():
        build, _, quota = label.rpartition("/")
        lifted = got.get((f"{build}/lifted", mode))
        if quota != "checked" or not lifted:
            continue
        ratios = [c["load"]["per_s"] / x["load"]["per_s"]
                  for c, x in zip(runs, lifted, strict=False)]
        lines.append(f"{build} {mode}: checked ÷ lifted " + ", ".join(
            f"{r:.2f}" for r in ratios) + f"; median {statistics.median(ratios):.2f}")
    return "\n".join(lines)


def variants(ap: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """Each build, per `--workers` and `--quotas` value: its label and its `swarm-api`."""
    builds = bench_builds(args, ("this", CLI))
    if args.workers:  # "this/w2": the build `this` served by two processes
        builds = {f"{k}/w{n}": v for k, v in builds.items() for n in args.workers.split(",")}
    if args.quotas:  # "main/checked": the build `main` with every quota checked
        quotas = args.quotas.split(",")
        if unknown := set(quotas) - QUOTAS.keys():
            ap.error(f"--quotas: unknown {sorted(unknown)}")
        builds = {f"{k}/{q}": v for k, v in builds.items() for q in quotas}
    return builds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--each", type=int, default=10)
    ap.add_argument("--single", type=int, default=200)
    add_builds(ap, "a build of swarm-api to measure (repeatable; default this checkout's)")
    ap.add_argument("--modes", default="engine,api")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--workers", default="",
                    help="serve --workers N for each N of a comma list (each its own build)")
    ap.add_argument("--checked", action="store_true",
                    help="every SPEC §8 quota set (none reached): admission's cost included")
    ap.add_argument("--profile", default="",
                    help="directory for py-spy raw profiles (BENCH_SPY_RATE samples/s, 200)")
    ap.add_argument("--quotas", default="",
                    help="a comma list of lifted, checked: each build run with each, their "
                         "order alternating by round (prints checked ÷ lifted per build)")
    ap.add_argument("--keyed", action="store_true",
                    help="a fresh Idempotency-Key on every POST, as the typed client sends")
    ap.add_argument("--client", default="httpx",
                    help="the load generator's HTTP client, or a comma list: httpx, aiohttp")
    args = ap.parse_args()
    builds = variants(ap, args)
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-create-"))
    sim_port = free_port()
    args.sim = f"http://127.0.0.1:{sim_port}/v1"
    got: dict[tuple[str, str], list[dict[str, dict[str, Any]]]] = {}
    with subprocess.Popen([CLI, "simulator", "--port", str(sim_port)],
                          env={**os.environ, "SWARM_SIM_LATENCY_MS": "0"},
                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT) as sim:
        try:
            wait_http(f"{args.sim}/models")
            for r in range(args.rounds):
                order = list(builds.items()) if r % 2 == 0 else list(reversed(builds.items()))
                for mode, client in itertools.product(args.modes.split(","),
                                                      args.client.split(",")):
                    for label, cli in order:
                        res = run(label, cli, mode, args, work, client)
                        shown = mode if client == "httpx" else f"{mode}/{client}"
                        got.setdefault((label, shown), []).append(res)
                        print(f"{label:>6} {shown:>6}: load {res['load']['per_s']:.0f}/s p50 "
                              f"{res['load']['p50'] * 1000:.0f} ms p99 "
                              f"{res['load']['p99'] * 1000:.0f} ms {errors_cell(res['load'])}"
                              f" cpu {res['load']['cpu_ms']:.2f} ms/req"
                              f" (client {res['load']['client_cpu_ms']:.1f},"
                              f" postgres {res['load']['db_cpu_ms']:.1f})"
                              f" | one client p50 {res['single']['p50'] * 1000:.1f} ms "
                              f"({res['single']['per_s']:.0f}/s) cpu "
                              f"{res['single']['cpu_ms']:.2f} ms/req", flush=True)
        finally:
            sim.terminate()
    print(f"\nmedians over {args.rounds} round(s), {args.clients} clients x {args.each}, "
          f"one client x {args.single}; load average {os.getloadavg()[0]:.1f}")
    for (label, mode), runs in got.items():
        med = {k: statistics.median(x["load"][k] for x in runs) for k in ("per_s", "p50",
                                                                           "p99")}
        one = statistics.median(x["single"]["p50"] for x in runs)
        errs = sum(x["load"]["errors"] for x in runs)
        print(f"| {label} | {mode} | {med['per_s']:.0f}/s | {med['p50'] * 1000:.0f} ms | "
              f"{med['p99'] * 1000:.0f} ms | {errs} | {one * 1000:.1f} ms |")
    if args.quotas:
        print(quota_ratios(got))
    if args.profile:
        for raw in sorted(Path(args.profile).glob("*.raw")):
            print(f"\n{raw.name}:")
            for frame, own, incl in top_frames(raw):
                print(f"  {own:5.1f}% self {incl:5.1f}% incl  {frame}")


if __name__ == "__main__":
    main()
