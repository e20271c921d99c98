"""A `serve` or `worker` process moves what it holds once started to the collector's permanent
generation (`runtime.freeze_startup_objects`); an app started in another program (a test
process) does not, since freezing is process-wide."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app import cli, main
from tests.conftest import make_settings

PROBE = """
import asyncio, gc, sys
from app.config import Settings
from app.main import create_app

app = create_app(Settings(_env_file=None, database_url=sys.argv[1]), freeze_gc=sys.argv[2] == "1")

async def started() -> None:
    async with app.router.lifespan_context(app):
        print(gc.get_freeze_count())

asyncio.run(started())
"""


@pytest.mark.parametrize("freeze", [True, False])
def test_an_app_started_with_freeze_gc_freezes_its_process(sqlite_url: str,
                                                           freeze: bool) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, sqlite_url, "1" if freeze else "0"],
                         capture_output=True, text=True, timeout=120, check=True)
    frozen = int(out.stdout.split()[-1])
    assert (frozen > 10_000) if freeze else (frozen == 0), out.stderr[-2000:]


def test_serve_asks_for_it_in_one_process_and_in_each_of_n(
        sqlite_url: str, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    # what `serve --workers` sets for its spawned processes, restored after the test
    for name, value in (("SWARM_AUTO_MIGRATE", "0"), ("SWARM_ENGINE", "1"),
                        ("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))):
        monkeypatch.setenv(name, value)

    made: list[dict[str, Any]] = []
    ran: list[object] = []
    real = main.create_app
    monkeypatch.setattr(main, "create_app", lambda *a, **kw: made.append(kw) or real(*a, **kw))
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: ran.append(app))
    cli.serve(make_settings(sqlite_url), "127.0.0.1", 0, engine=True)
    assert made[-1]["freeze_gc"] is True
    cli.serve(make_settings(pg_url, migrate_on_start=False), "127.0.0.1", 0, engine=True,
              workers=2)
    assert ran[-1] == "app.main:serve_app"  # each spawned process builds its app with it
    main.serve_app()
    assert made[-1]["freeze_gc"] is True
