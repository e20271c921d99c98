"""What a `swarm-api serve` under test runs on: this checkout's CLI, a throwaway PostgreSQL
database and a tenants file (SPEC §8's quotas lifted, or all set and none reached)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support import throwaway_db

CLI = str(Path(sys.executable).with_name("swarm-api"))
# SPEC §8 without the limits a load test would measure instead of the API: no token bucket
# (600 requests/min would refuse most of it with 429), no active-swarm count or daily cap;
# budgets and per-process caps as SPEC's defaults
BENCH_TENANTS = """[defaults]
max_agents = 1000
max_inflight_calls = 256
default_budget_usd = "10"
max_budget_usd = "100"
max_streams = 10000
"""
# every SPEC §8 key set, none reached: each request pays for the bucket, the count, the cap
CHECKED_TENANTS = """[defaults]
requests_per_minute = 100000000
burst = 10000000
max_active_swarms = 10000000
max_agents = 1000
max_inflight_calls = 256
default_budget_usd = "10"
max_budget_usd = "100"
daily_budget_usd = "1000000"
max_streams = 10000
"""
# the tenants files by the name `--quotas` (and bench_rows, the table) give them
QUOTAS = {"lifted": BENCH_TENANTS, "checked": CHECKED_TENANTS}


@contextlib.contextmanager
def serve_db(prefix: str) -> Iterator[dict[str, str]]:
    """A throwaway PostgreSQL database for a `serve` under test, as that process's environment:
    left empty for the build to migrate itself (SWARM_AUTO_MIGRATE), so builds with other
    migrations than this checkout's compare too."""
    with throwaway_db(prefix, migrate=False) as url:
        yield {"SWARM_DATABASE_URL": url, "SWARM_AUTO_MIGRATE": "1"}


def tenants_file(work: Path, text: str = BENCH_TENANTS) -> Path:
    path = work / f"bench-tenants-{abs(hash(text))}.toml"
    path.write_text(text)
    return path
