"""The simulator's own cost, build against build: its CPU per chat request at 0 ms, and what a
bare gather on aiohttp (bench/table_rows.py `bare_gather`, persisting nothing) reads against
it on issue 53's wall-over-floor rows. Each build's `swarm-api simulator` runs in its own
process for the whole run; the builds alternate measurement by measurement (the machine's
speed drifts over a minute), and the figure is the median of the rounds with their range.

    flock /work/bench.lock .venv/bin/python -m bench.bench_simulator \
        --cli before=/work/main/.venv/bin/swarm-api --cli after=.venv/bin/swarm-api \
        [--rounds 5] [--calls 3000] [--profile DIR]

- CPU per request: user + system CPU of the simulator's process over `--calls` requests at
  0 ms, 64 in flight (the load generator's CPU is not in it).
- fan-out: 100 calls + a synthesis call at 500 ms, 100 in flight, over the floor 2 x 500 ms.
- wide: 1,000 calls at 200 ms, 256 in flight, over the floor 1,000 / 256 x 0.2 s.

`--profile DIR`: py-spy `--gil` on each build's simulator over one more CPU run, its top
frames printed (raw profiles in DIR). Prints; writes nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
from pathlib import Path

from bench.builds import add_builds
from bench.builds import builds as bench_builds
from bench.cpu import cpu_s
from bench.profiles import profiled, top_frames
from bench.service import CLI
from bench.table_rows import bare_gather
from tests.support import free_port, process

FANOUT_FLOOR_S = 2 * 0.5
WIDE_CALLS, WIDE_IN_FLIGHT = 1000, 256
WIDE_FLOOR_S = WIDE_CALLS / WIDE_IN_FLIGHT * 0.2


async def cpu_per_request(url: str, pid: int, calls: int) -> float:
    """Milliseconds of the simulator's CPU per chat request at 0 ms, 64 in flight."""
    before = cpu_s(pid)
    await bare_gather(url, calls, 64, 0, False, on_aiohttp=True)
    return (cpu_s(pid) - before) / (calls + 1) * 1000  # +1: bare_gather's warm-up call


async def measure(sims: dict[str, tuple[str, int]], rounds: int, calls: int
                  ) -> dict[str, dict[str, list[float]]]:
    out = {name: {"cpu_ms": [], "fanout": [], "wide": []} for name in sims}
    for url, _ in sims.values():  # connections, imports, first-call caches
        await bare_gather(url, 200, 64, 0, False, on_aiohttp=True)
    for r in range(rounds):
        for kind in ("cpu_ms", "fanout", "wide"):
            for name, (url, pid) in sims.items():
                if kind == "cpu_ms":
                    value = await cpu_per_request(url, pid, calls)
                elif kind == "fanout":
                    value = await bare_gather(url, 100, 100, 500, True,
                                              on_aiohttp=True) / FANOUT_FLOOR_S
                else:
                    value = await bare_gather(url, WIDE_CALLS, WIDE_IN_FLIGHT, 200, False,
                                              on_aiohttp=True) / WIDE_FLOOR_S
                out[name][kind].append(value)
        print(f"round {r + 1}: " + "; ".join(
            f"{n} cpu {v['cpu_ms'][-1]:.3f} ms, fan-out {v['fanout'][-1]:.3f}, "
            f"wide {v['wide'][-1]:.3f}" for n, v in out.items()), flush=True)
    return out


def report(results: dict[str, dict[str, list[float]]]) -> None:
    labels = {"cpu_ms": "simulator CPU per chat request at 0 ms (ms)",
              "fanout": "bare gather on aiohttp: 100 + synthesis at 500 ms, over 2 x 500 ms",
              "wide": "bare gather on aiohttp: 1,000 at 200 ms, 256 in flight, over floor"}
    for kind, label in labels.items():
        print(f"\n{label}")
        for name, values in results.items():
            v = values[kind]
            print(f"  {name:>8}: median {statistics.median(v):.3f} "
                  f"(range {min(v):.3f} to {max(v):.3f}, {len(v)} rounds)")


async def profile(sims: dict[str, tuple[str, int]], calls: int, folder: Path) -> None:
    for name, (url, pid) in sims.items():
        raw = folder / f"{name}.raw"
        with profiled(pid, raw):
            await bare_gather(url, calls, 64, 0, False, on_aiohttp=True)
        print(f"\n{name}: top frames by self time (self %, inclusive %), {raw}")
        for frame, own, incl in top_frames(raw, 20):
            print(f"  {own:5.1f} {incl:5.1f}  {frame[-110:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_builds(parser, "a build whose simulator to measure (repeatable; default this "
                       "checkout's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--profile", type=Path, default=None)
    args = parser.parse_args()
    builds = bench_builds(args, ("this", CLI))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        sims: dict[str, tuple[str, int]] = {}
        for name, cli in builds.items():
            port = free_port()
            url = f"http://127.0.0.1:{port}/v1"
            proc = stack.enter_context(process(
                ["simulator", "--port", str(port)], {"SWARM_SIM_LATENCY_MS": "0"},
                f"{url}/models", Path(tmp) / f"sim-{name}.log", cli=cli))
            sims[name] = (url, proc.pid)
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            asyncio.run(profile(sims, args.calls, args.profile))
        report(asyncio.run(measure(sims, args.rounds, args.calls)))


if __name__ == "__main__":
    main()
