"""The client commands of the `swarm-api` console script (SPEC §13): submit, get, ls, watch,
cancel, retry, usage. `app/cli.py` dispatches here; nothing of the server is imported.

Exit status: 0 done (for submit --wait, watch and retry --wait: the swarm succeeded); 1 the
swarm failed or was cancelled (or did not finish in time); 2 a bad argument or a request the
service refused; 3 the service cannot be reached; 4 the service refused the API key; 130
interrupted (Ctrl-C stops the client, not the swarm).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarm_api_client._base import DEFAULT_URL, TERMINAL, RetryPolicy
from swarm_api_client.client import SwarmClient
from swarm_api_client.errors import (
    ConnectionFailed,
    Forbidden,
    SwarmApiError,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)

if TYPE_CHECKING:  # rich loads when a command prints, not when the parser is built
    from rich.console import Console

    from app.schemas import SwarmEvent, SwarmRead

OK, NOT_SUCCEEDED, REFUSED, UNREACHABLE, KEY_REFUSED, INTERRUPTED = 0, 1, 2, 3, 4, 130
COMMANDS = ("submit", "get", "ls", "watch", "cancel", "retry", "usage")
REFRESH_S = 1.0  # the live view re-reads the swarm (spend, new subtasks) at most this often
# a person waits at the terminal: give up on an unreachable service within a few seconds
CLI_RETRY = RetryPolicy(max_retries=3)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the client commands to the console script's sub-parsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None,
                        help=f"the service (default: $SWARM_URL or {DEFAULT_URL}); the API "
                        "key comes from $SWARM_API_KEY")
    common.add_argument("--json", action="store_true", help="print JSON (for scripts)")

    p = sub.add_parser("submit", parents=[common],
                       help="start a swarm from a JSON file (- = stdin)")
    p.add_argument("file", help="the request body of POST /swarms, as JSON; - reads stdin")
    p.add_argument("--wait", action="store_true", help="follow it live until it ends")
    p.add_argument("--idempotency-key", default=None, help="default: a new one")
    p.add_argument("--timeout", type=float, default=None, help="give up waiting after S seconds")
    sub.add_parser("get", parents=[common], help="show a swarm").add_argument("id")
    p = sub.add_parser("ls", parents=[common], help="list swarms, newest first")
    p.add_argument("--status", default=None,
                   choices=["queued", "planning", "running", "synthesizing", *sorted(TERMINAL)])
    p.add_argument("--limit", type=int, default=20, help="at most N swarms (default 20)")
    sub.add_parser("watch", parents=[common],
                   help="follow a swarm's events live (--json: one event per line)"
                   ).add_argument("id")
    sub.add_parser("cancel", parents=[common], help="cancel a swarm").add_argument("id")
    p = sub.add_parser("retry", parents=[common], help="run a failed or cancelled swarm again")
    p.add_argument("id")
    p.add_argument("--wait", action="store_true", help="follow the new swarm live until it ends")
    p.add_argument("--limits", default=None, metavar="JSON",
                   help='the new run\'s limits, e.g. \'{"failure_tolerance": 0.5}\' (keys left '
                   "out keep the old run's values)")
    p = sub.add_parser("usage", parents=[common], help="spend and tokens from the ledger")
    p.add_argument("--from", dest="start", default=None, help="ISO date or datetime (inclusive)")
    p.add_argument("--to", dest="end", default=None, help="ISO date or datetime (exclusive)")
    p.add_argument("--group-by", default="model", choices=["model", "day", "tenant"])


def run(args: argparse.Namespace) -> int:
    """Run one client command; every failure is a message on stderr and an exit status."""
    command: Callable[[SwarmClient, argparse.Namespace], int] = _HANDLERS[args.command]
    url = args.url or os.environ.get("SWARM_URL") or DEFAULT_URL
    try:
        with SwarmClient(url, retry=CLI_RETRY) as client:
            return command(client, args)
    except (Unauthorized, Forbidden) as exc:
        hint = "" if os.environ.get("SWARM_API_KEY") else " (SWARM_API_KEY is not set)"
        return _fail(KEY_REFUSED, f"the service at {url} refused the API key{hint}: {exc}")
    except ConnectionFailed as exc:
        return _fail(UNREACHABLE, f"{exc.message}. Is `swarm-api serve` running there? "
                     "Set SWARM_URL (or --url) to point at it.")
    except Unavailable as exc:
        return _fail(UNREACHABLE, f"the service at {url} is unavailable: {exc}")
    except WaitTimeout as exc:
        return _fail(NOT_SUCCEEDED, str(exc.message))
    except SwarmApiError as exc:
        details = f" {json.dumps(exc.details)}" if exc.details else ""
        return _fail(REFUSED, f"error: {exc}{details}")
    except _BadInput as exc:
        return _fail(REFUSED, f"error: {exc}")
    except KeyboardInterrupt as exc:  # only the client stops: a swarm goes on running
        swarm_id = exc.swarm_id if isinstance(exc, _Interrupted) else "ID"
        what = f"swarm {swarm_id}" if isinstance(exc, _Interrupted) else "a submitted swarm"
        return _fail(INTERRUPTED, f"interrupted ({what} keeps running: `swarm-api watch "
                     f"{swarm_id}` follows it again, `swarm-api cancel {swarm_id}` stops it)")


class _BadInput(Exception):
    pass


class _Interrupted(KeyboardInterrupt):
    """Ctrl-C while following a swarm this command created: its id is in the message."""

    def __init__(self, swarm_id: str) -> None:
        super().__init__(swarm_id)
        self.swarm_id = swarm_id


def _fail(status: int, message: str) -> int:
    print(message, file=sys.stderr)
    return status


def _console() -> Console:
    from rich.console import Console

    return Console(highlight=False)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _read_body(name: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
    except OSError as exc:
        raise _BadInput(f"cannot read {name}: {exc.strerror or exc}") from exc
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise _BadInput(f"{'stdin' if name == '-' else name} is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _BadInput("the request body must be a JSON object, e.g. {\"task\": \"...\"}")
    return body


def _outcome(swarm: SwarmRead) -> int:
    """0 when the swarm succeeded, else 1 with its error code on stderr."""
    if swarm.status == "succeeded":
        return OK
    err = swarm.error or {}
    code = err.get("code") or swarm.status
    return _fail(NOT_SUCCEEDED, f"swarm {swarm.id} {swarm.status}: {code}: "
                 f"{err.get('message', '')}".rstrip(": "))


def follow(client: SwarmClient, swarm_id: str, console: Console,
           timeout: float | None = None) -> SwarmRead:
    """Show the swarm live from its event stream until it ends; returns its final state."""
    from rich.live import Live

    from swarm_api_client.view import LiveSwarm

    view = LiveSwarm(client.get(swarm_id))
    if view.status in TERMINAL:
        return view.snapshot
    deadline = None if timeout is None else time.monotonic() + timeout
    read_at = time.monotonic()
    events = _events_in_background(client, swarm_id)
    with Live(view, console=console, refresh_per_second=4, transient=True):
        while True:
            # the stream may say nothing for long (a slow call): the timeout and the
            # refresh are the clock's, not the next event's
            wait = REFRESH_S if deadline is None else min(REFRESH_S, deadline - time.monotonic())
            try:
                event = events.get(timeout=max(wait, 0.0))
            except queue.Empty:
                event = None
            if isinstance(event, BaseException):
                raise event
            if event is not None:
                view.apply(event)
                if event.event == "swarm.completed":
                    break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise WaitTimeout(f"swarm {swarm_id} is still {view.status} after {timeout}s",
                                  code="wait_timeout")
            if view.stale or now - read_at >= REFRESH_S:
                view.refresh(client.get(swarm_id))
                read_at = now
    # the stream ends with the terminal status committed: one read for the final figures
    return client.get(swarm_id)


def _events_in_background(client: SwarmClient, swarm_id: str
                          ) -> queue.Queue[SwarmEvent | BaseException]:
    """The swarm's events, read by a daemon thread into a queue (an error, last, as itself):
    the reader may block on a quiet stream while the live view keeps time."""
    out: queue.Queue[SwarmEvent | BaseException] = queue.Queue()

    def read() -> None:
        try:
            for event in client.events(swarm_id, last_event_id=None):
                out.put(event)
        except BaseException as exc:  # handed to the view's thread, which raises it
            out.put(exc)

    threading.Thread(target=read, name=f"events-{swarm_id}", daemon=True).start()
    return out


def _finish(client: SwarmClient, swarm: SwarmRead, args: argparse.Namespace) -> int:
    """Submit/retry: without --wait print the new swarm; with it follow, then summarise."""
    if not args.wait:
        if args.json:
            _print_json(swarm.model_dump(mode="json"))
        else:
            print(f"{swarm.id} {swarm.status}")
        return OK
    timeout = getattr(args, "timeout", None)
    try:
        if args.json:
            final = client.wait(swarm.id, timeout=timeout)
            _print_json(final.model_dump(mode="json"))
            return _outcome(final)
        console = _console()
        final = follow(client, swarm.id, console, timeout)
    except KeyboardInterrupt:  # the swarm was created: say which one goes on running
        raise _Interrupted(swarm.id) from None
    from swarm_api_client.view import print_summary

    print_summary(console, final)
    return _outcome(final)


def _submit(client: SwarmClient, args: argparse.Namespace) -> int:
    body = _read_body(args.file)
    return _finish(client, client.create(body, idempotency_key=args.idempotency_key), args)


def _retry(client: SwarmClient, args: argparse.Namespace) -> int:
    limits = None
    if args.limits is not None:
        try:
            limits = json.loads(args.limits)
        except ValueError as exc:
            raise _BadInput(f"--limits is not valid JSON: {exc}") from exc
        if not isinstance(limits, dict):
            raise _BadInput('--limits must be a JSON object, e.g. {"budget_usd": 5}')
    swarm = client.retry(args.id, limits=limits)
    if not args.json:
        print(f"retry of {args.id}: new swarm {swarm.id}", file=sys.stderr)
    return _finish(client, swarm, args)


def _get(client: SwarmClient, args: argparse.Namespace) -> int:
    swarm = client.get(args.id)
    if args.json:
        _print_json(swarm.model_dump(mode="json"))
    else:
        from swarm_api_client.view import print_summary

        print_summary(_console(), swarm)
    return OK


def _watch(client: SwarmClient, args: argparse.Namespace) -> int:
    if args.json:
        status = None
        for event in client.events(args.id):
            print(event.model_dump_json(), flush=True)
            if event.event == "swarm.completed":
                status = event.data.get("status")
        return OK if status == "succeeded" else _outcome(client.get(args.id))
    from swarm_api_client.view import print_summary

    console = _console()
    final = follow(client, args.id, console)
    print_summary(console, final)
    return _outcome(final)


def _ls(client: SwarmClient, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise _BadInput("--limit must be at least 1")
    swarms = list(itertools.islice(
        client.list(status=args.status, page_size=min(args.limit, 200)), args.limit))
    if args.json:
        _print_json([s.model_dump(mode="json") for s in swarms])
        return OK
    from swarm_api_client.view import swarms_table

    console = _console()
    if swarms:
        console.print(swarms_table(swarms))
    else:
        console.print("no swarms" + (f" with status {args.status}" if args.status else ""))
    return OK


def _cancel(client: SwarmClient, args: argparse.Namespace) -> int:
    swarm = client.cancel(args.id)
    if args.json:
        _print_json(swarm.model_dump(mode="json"))
    else:
        print(f"cancel requested: {swarm.id} {swarm.status}")
    return OK


def _usage(client: SwarmClient, args: argparse.Namespace) -> int:
    report = client.usage(start=args.start, end=args.end, group_by=args.group_by)
    if args.json:
        _print_json(report.model_dump(mode="json", by_alias=True))
        return OK
    from swarm_api_client.view import usage_table

    _console().print(usage_table(report))
    return OK


_HANDLERS: dict[str, Callable[[SwarmClient, argparse.Namespace], int]] = {
    "submit": _submit, "get": _get, "ls": _ls, "watch": _watch, "cancel": _cancel,
    "retry": _retry, "usage": _usage,
}
