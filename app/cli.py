"""The `swarm-api` console script: serve, worker, migrate, simulator, prune, and the client
commands (submit, get, ls, watch, cancel, retry, erase, usage) of `swarm_api_client.cli`, which
need none of the server's dependencies."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import signal
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

    from app.config import Settings

log = logging.getLogger("swarm_api")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(settings: Settings, host: str, port: int, engine: bool, workers: int = 1) -> int:
    import uvicorn

    from app import logs

    if not settings.auth_enabled and not settings.allow_open and not _is_loopback(host):
        logs.say(f"refusing to bind {host} without SWARM_API_KEYS (set SWARM_ALLOW_OPEN=1 "
                 "to serve an open API)")
        return 2
    if workers > 1:
        return _serve_workers(settings, host, port, engine, workers)

    from app.main import create_app

    app = create_app(settings, run_engine=engine, freeze_gc=True)
    banner(settings, host, port)
    uvicorn.run(app, host=host, port=port, access_log=False,
                log_config=logs.config(settings.log_format, settings.log_level),
                timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 5)
    return 1 if app.state.died else 0


def banner(settings: Settings, host: str, port: int) -> None:
    """Where the API, its documentation and the UI are, and whether auth is off (SPEC §17):
    log lines like any other."""
    base = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    log.info("API on %s, its documentation on %s/docs, the UI on %s/ui", base, base, base)
    if settings.auth_enabled:
        log.info("auth on: every /swarms route needs a key of SWARM_API_KEYS")
    elif settings.allow_open:
        log.warning("auth is OFF (SWARM_ALLOW_OPEN=1, no SWARM_API_KEYS): anyone who reaches "
                    "%s can run swarms on your gateway key", base)
    else:
        log.warning("auth is off (no SWARM_API_KEYS): only loopback clients are served")


def configuration_errors(exc: ValidationError) -> str:
    """One line a setting: its variable and what is wrong, never the value it was given
    (pydantic's own text repeats it: a database URL's password, a key)."""
    lines = []
    for err in exc.errors(include_url=False, include_input=False):
        name = "SWARM_" + "_".join(str(p) for p in err["loc"]).upper() if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {name}: {msg}" if name and not msg.startswith(name) else f"  {msg}")
    return "\n".join(lines)


def migrate(settings: Settings) -> bool:
    """`alembic upgrade head`; a database it cannot reach (refused, not created, a wrong
    password) is one line on stderr and False, not a traceback. A migration that fails on a
    reachable database raises: its traceback is what to fix."""
    from app import logs
    from app.db.migrate import upgrade_head
    from app.db.retry import database_unavailable, reason

    try:
        upgrade_head(settings.database_url, settings.migrations_dir)
    except Exception as exc:
        if not database_unavailable(exc):
            raise
        logs.say(f"swarm-api: cannot migrate: database unavailable ({reason(exc)})")
        return False
    return True


def _serve_workers(settings: Settings, host: str, port: int, engine: bool,
                   workers: int) -> int:
    """N uvicorn processes on one socket, each an API (and engine) like one `serve`: they
    share the database as replicas do (leases decide who runs a swarm) and their metrics
    through prometheus-client's multiprocess directory; uvicorn restarts one that dies."""
    import os
    import tempfile

    import uvicorn

    from app import logs
    from app.db.dialect import dialect_of, migrates_on_start

    if not dialect_of(settings.database_url).shared:
        logs.say("swarm-api: serve --workers needs PostgreSQL (SWARM_DATABASE_URL): SQLite "
                 "is the one-process embedded default")
        return 2
    # once, here: N processes migrating at once race
    if migrates_on_start(settings.database_url, settings.auto_migrate) and not migrate(settings):
        return 1
    # what the spawned processes read when they build their Settings and import metrics
    os.environ["SWARM_AUTO_MIGRATE"] = "0"
    os.environ["SWARM_ENGINE"] = "1" if engine else "0"
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="swarm-metrics-")
    log.info("serving with %d worker processes (metrics in %s)", workers,
             os.environ["PROMETHEUS_MULTIPROC_DIR"])
    banner(settings, host, port)
    uvicorn.run("app.main:serve_app", factory=True, workers=workers, host=host, port=port,
                log_config=logs.config(settings.log_format, settings.log_level),
                access_log=False,
                timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 5)
    return 0


async def _worker(settings: Settings) -> int:
    from app import logs, metrics
    from app.runtime import Runtime

    metrics.set_price_table(settings.prices)
    server = None
    if settings.metrics_port is not None:
        # the engine's series live here, not in the API process: Prometheus scrapes workers too
        try:
            server, _ = metrics.serve_http(settings.metrics_port, settings.metrics_host)
        except OSError as exc:  # the port taken, a host not of this machine: as uvicorn says it
            logs.say(f"swarm-api worker: cannot serve /metrics on {settings.metrics_host}:"
                     f"{settings.metrics_port} (SWARM_METRICS_PORT): {exc}")
            return 1
        log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    died: str | None = None
    try:
        async with Runtime(settings, run_engine=True, listen_changes=False,
                           freeze_gc=True) as runtime:
            assert runtime.engine is not None
            log.info("worker %s running", runtime.engine.owner)
            failed = asyncio.create_task(runtime.wait_failed())
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait([failed, stopped], return_when=asyncio.FIRST_COMPLETED)
            if failed.done():
                died = failed.result()
                log.critical("stopping the worker: %s", died)
            else:
                failed.cancel()
                log.info("stopping: finishing in-flight work for up to %ss",
                         settings.shutdown_grace_s)
    finally:
        if server is not None:
            await asyncio.to_thread(server.shutdown)
    return 1 if died else 0


def _duration(value: str) -> timedelta:
    """An argparse type: `<n>s|m|h|d`; anything else is a usage error (exit 2)."""
    from app.engine.retention import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


async def _prune(settings: Settings, args: argparse.Namespace) -> int:
    """`swarm-api prune`: erase the content of swarms that ended before --older-than (and
    remove ledger rows older than --ledger-older-than), on SWARM_DATABASE_URL directly."""
    from app import logs
    from app.db import erase
    from app.db.retry import database_not_migrated, database_unavailable, reason
    from app.db.session import db_now, make_db_engine, make_session_factory
    from app.engine.retention import erase_all

    engine = make_db_engine(settings.database_url)
    sessions = make_session_factory(engine)
    dry, tenant = args.dry_run, args.tenant
    try:
        if args.older_than is not None:
            rules = [erase.Rule(args.older_than, tenants=None if tenant is None else (tenant,))]
            if dry:
                async with sessions() as s, s.begin():
                    n = await erase.count_erasable(s, rules)
            else:
                n = await erase_all(sessions, rules, settings.retention_batch, sweep=False)
            print(f"{'would erase' if dry else 'erased'} {n} swarms")
        if args.ledger_older_than is not None:
            total = 0
            while True:  # in batches: no transaction holds the ledger long
                async with sessions() as s, s.begin():
                    before = await db_now(s) - args.ledger_older_than
                    n = await erase.prune_ledger(s, before, tenant, dry_run=dry)
                total += n
                if dry or not n:
                    break
            print(f"{'would remove' if dry else 'removed'} {total} ledger rows")
    except Exception as exc:
        if database_unavailable(exc):
            logs.say(f"swarm-api prune: database unavailable ({reason(exc)})")
        elif database_not_migrated(exc):
            logs.say("swarm-api prune: database not migrated (run `swarm-api migrate`)")
        else:
            raise
        return 1
    finally:
        await engine.dispose()
    return 0


def main(argv: list[str] | None = None) -> int:
    try:  # the client's imports take ~0.5 s: a Ctrl-C then is an interrupt, not a traceback
        from swarm_api_client import cli as client_cli
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    from swarm_api_client.cli_args import root_parser

    parser, sub = root_parser()
    p_serve = sub.add_parser("serve", help="the HTTP API (and, by default, the engine)")
    p_serve.add_argument("--host", default="127.0.0.1")
    p_serve.add_argument("--port", type=int, default=8000)
    p_serve.add_argument("--no-engine", action="store_true", help="API only (scale-out)")
    p_serve.add_argument("--workers", type=int, default=1,
                         help="API processes on one port (PostgreSQL only; default 1)")
    sub.add_parser("worker", help="the engine alone")
    sub.add_parser("migrate", help="alembic upgrade head")
    p_sim = sub.add_parser("simulator", help="the simulated gateway as its own process")
    p_sim.add_argument("--host", default="127.0.0.1")
    p_sim.add_argument("--port", type=int, default=8100)
    p_prune = sub.add_parser(
        "prune", help="erase the content of swarms that ended before a time, now "
        "(SWARM_DATABASE_URL directly: no service needed)")
    p_prune.add_argument("--older-than", type=_duration, metavar="DURATION",
                         help="swarms that ended more than this ago: <n>s|m|h|d, e.g. 30d")
    p_prune.add_argument("--tenant", help="only this tenant's swarms (and ledger rows)")
    p_prune.add_argument("--dry-run", action="store_true", help="count, change nothing")
    p_prune.add_argument("--ledger-older-than", type=_duration, metavar="DURATION",
                         help="also remove ledger rows recorded more than this ago, e.g. "
                         "400d (spend reports over that time lose them)")
    client_cli.add_commands(sub)
    args = parser.parse_args(argv)
    if args.command == "prune" and args.older_than is None and args.ledger_older_than is None:
        p_prune.error("name what to prune: --older-than and/or --ledger-older-than")
    if args.command in client_cli.COMMANDS:
        return client_cli.run(args)
    from pydantic import ValidationError

    from app import logs
    from app.config import LogSettings, Settings

    try:  # first: the refusal of any other setting is logged in the format asked for
        log_settings = LogSettings()
    except ValidationError as exc:
        print(f"swarm-api: invalid configuration:\n{configuration_errors(exc)}", file=sys.stderr)
        return 2
    log_config = logs.configure(log_settings.log_format, log_settings.log_level)
    if args.command == "simulator":
        from app.simulator import run_simulator

        run_simulator(args.host, args.port, log_config=log_config)
        return 0
    try:  # a bad setting or file (SWARM_TENANTS_FILE, ...) stops the process, saying why
        settings = Settings()
    except ValidationError as exc:
        logs.say(f"swarm-api: invalid configuration:\n{configuration_errors(exc)}")
        return 2
    if args.command == "migrate":
        if not migrate(settings):
            return 1
        logs.say("database at head", error=False)
        return 0
    if args.command == "prune":
        return asyncio.run(_prune(settings, args))
    if args.command == "worker":
        with contextlib.suppress(ImportError):
            import uvloop  # what uvicorn runs `serve` on: markedly less CPU per call

            uvloop.install()
        with contextlib.suppress(KeyboardInterrupt):
            return asyncio.run(_worker(settings))
        return 0
    if args.command == "serve" and args.workers < 1:
        logs.say("swarm-api: --workers must be at least 1")
        return 2
    return serve(settings, args.host, args.port, engine=settings.engine and not args.no_engine,
                 workers=args.workers)


if __name__ == "__main__":
    raise SystemExit(main())
