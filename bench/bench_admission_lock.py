"""How fast PostgreSQL alone takes one tenant's creations when each holds the tenant's lock:
the real creation statements of 1-agent swarms (`create.insert_swarm_alone`), built before the
run, sent by `--connections` concurrent connections of one process, with SPEC §8's quotas
checked (`tenant_admit`: the tenant's bucket row, locked to the commit) or lifted.

Modes, each a round in turn: `lifted` (no lock); `checked` (this checkout: the lock taken
once the subtasks are in, the commit not waiting for its flush, the caller waiting for a
flush shared with the others, `app/db/durable.py`); `checked-sync` (the statement before
decision 0039: the lock taken first and held through the commit's flush, rebuilt by
switching both off); `checked-keyed` (the same as `checked` with an Idempotency-Key); `token` and
`token-sync` (the facade's token alone, `quotas.admit_alone`, as built and as before).

    .venv/bin/python -m bench.bench_admission_lock --creations 3000 --connections 32 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from app.db import create, creation_statement, durable, quotas
from app.db.quotas import Admit
from app.engine.specs import build_swarm
from app.schemas import SwarmCreate
from tests.conftest import make_settings
from tests.support import throwaway_db

BODY = {"task": "t", "agents": [{"name": "a"}]}
MODES = ("lifted", "checked", "checked-sync", "checked-keyed", "token", "token-sync")
# every quota of bench/service.py CHECKED_TENANTS, none reached
ADMIT = Admit("bench", 1e7, 1e8 / 60, 10**7, Decimal(10**6))


@contextlib.contextmanager
def statement_before() -> Iterator[None]:
    """The creation statement as it was before decision 0039: the lock first, a synchronous
    commit (the statement shapes are cached: cleared on the way in and out)."""
    saved = (creation_statement.ASYNC_COMMIT, creation_statement._admission,
             quotas._ADMIT_ALONE, durable.flushed)
    admission = creation_statement._admission
    creation_statement.ASYNC_COMMIT = "true"
    creation_statement._admission = (  # type: ignore[assignment]
        lambda admit, first, params: admission(admit, [], params))
    quotas._ADMIT_ALONE = quotas._ADMIT_CALL
    durable.flushed = _nothing  # the commit was the flush
    creation_statement._creation.cache_clear()
    try:
        yield
    finally:
        (creation_statement.ASYNC_COMMIT, creation_statement._admission,
         quotas._ADMIT_ALONE, durable.flushed) = saved
        creation_statement._creation.cache_clear()


async def creations(url: str, mode: str, count: int, connections: int) -> tuple[float, int]:
    """(creations a second, flushes sent) for `count` creations in `mode`."""
    engine = create_async_engine(url, pool_size=connections + 1, max_overflow=0)
    keyed = mode == "checked-keyed"
    made = []
    for i in range(count):
        new = build_swarm(SwarmCreate.model_validate(BODY), make_settings(url), "bench",
                          idempotency_key=f"k{time.time_ns()}-{i}" if keyed else None)
        made.append(new)
    work = iter(made)
    admit = None if mode == "lifted" else ADMIT

    token = mode.startswith("token")

    async def connection() -> None:
        for new in work:
            if token:  # the facade's statement: the token alone
                await quotas.admit_alone(engine, ADMIT)
                continue
            await create.insert_swarm_alone(engine, new.swarm, new.subtasks, claim_for="bench",
                                            lease_s=30.0, position=True, admit=admit,
                                            key_ttl_s=86400.0 if keyed else None)

    flusher = durable.flusher(engine)
    with statement_before() if mode.endswith("-sync") else contextlib.nullcontext():
        t0 = time.perf_counter()
        await asyncio.gather(*(connection() for _ in range(connections)))
        wall = time.perf_counter() - t0
    await engine.dispose()
    return count / wall, flusher.flushes


async def _nothing(engine: Any) -> None:
    return None


async def run(url: str, args: argparse.Namespace) -> None:
    got: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(args.rounds):
        line = []
        for mode in MODES if i % 2 == 0 else reversed(MODES):
            rate, flushes = await creations(url, mode, args.creations, args.connections)
            got[mode].append(rate)
            line.append(f"{mode} {rate:.0f}/s" + (f" ({flushes} flushes)" if flushes else ""))
        print(f"round {i + 1}: " + ", ".join(line), flush=True)
    print("median: " + ", ".join(f"{m} {statistics.median(v):.0f}/s" for m, v in got.items()))
    before = statistics.median(got["checked-sync"])
    print(f"checked ÷ checked-sync {statistics.median(got['checked']) / before:.2f}x; "
          f"checked-keyed ÷ checked-sync {statistics.median(got['checked-keyed']) / before:.2f}x;"
          f" token ÷ token-sync "
          f"{statistics.median(got['token']) / statistics.median(got['token-sync']):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creations", type=int, default=3000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with throwaway_db("swarm_bench_lock") as url:
        asyncio.run(run(url, args))


if __name__ == "__main__":
    main()
