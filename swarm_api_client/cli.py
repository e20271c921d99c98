"""The client commands of the `swarm-api` console script (SPEC §13): submit, get, ls, watch,
cancel, retry, erase, approve, reject, usage, audit, estimate. `app/cli.py` dispatches here;
nothing of the server is imported.

Exit statuses and help: `cli_args.py`. Written to a terminal, the commands draw with rich
(`view.py`); to a pipe or a file, plain columns of whole values (`report.py`) or --json. Every
failure is one line on stderr and its exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

from swarm_api_client._base import DEFAULT_URL, TERMINAL, RetryPolicy
from swarm_api_client.cli_args import (
    COMMANDS,
    INTERRUPTED,
    KEY_REFUSED,
    NOT_SUCCEEDED,
    OK,
    REFUSED,
    UNREACHABLE,
    add_commands,
)
from swarm_api_client.cli_input import BadInput as _BadInput
from swarm_api_client.cli_input import read_body as _read_body
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

    from app.schemas import SwarmRead

__all__ = ["COMMANDS", "add_commands", "run"]

REFRESH_S = 1.0  # the live view re-reads the swarm (spend, new subtasks) at most this often
# a person waits at the terminal: give up on an unreachable service within a few seconds
CLI_RETRY = RetryPolicy(max_retries=3)


def run(args: argparse.Namespace) -> int:
    """Run one client command; every failure is one line on stderr and an exit status."""
    command: Callable[[SwarmClient, argparse.Namespace], int] = _HANDLERS[args.command]
    try:
        url = _service_url(args.url)
    except _BadInput as exc:
        return _fail(REFUSED, str(exc))
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
        return _fail(REFUSED, f"{exc}{details}")
    except _BadInput as exc:
        return _fail(REFUSED, str(exc))
    except httpx.HTTPError as exc:  # what the client does not type: a protocol error, ...
        return _fail(UNREACHABLE, f"cannot talk to the Swarm API at {url}: "
                     f"{type(exc).__name__}: {exc}")
    except BrokenPipeError:  # `swarm-api ls | head -1`: the reader has all it wanted
        _drop_stdout()
        return OK
    except KeyboardInterrupt as exc:  # only the client stops: a swarm goes on running
        swarm_id = exc.swarm_id if isinstance(exc, _Interrupted) else "ID"
        what = f"swarm {swarm_id}" if isinstance(exc, _Interrupted) else "a submitted swarm"
        return _fail(INTERRUPTED, f"interrupted ({what} keeps running: `swarm-api watch "
                     f"{swarm_id}` follows it again, `swarm-api cancel {swarm_id}` stops it)")
    except Exception as exc:  # a defect of the client: still one line, not a traceback
        return _fail(NOT_SUCCEEDED, f"unexpected error: {type(exc).__name__}: {exc}")


def _service_url(given: str | None) -> str:
    """--url, else SWARM_URL, else the default: an http(s) URL with a host, or `_BadInput`."""
    env = os.environ.get("SWARM_URL")
    raw = given or env or DEFAULT_URL
    source = "--url" if given else ("SWARM_URL" if env else "the default URL")
    try:
        url = httpx.URL(raw)
    except httpx.InvalidURL as exc:
        raise _BadInput(f"{source} {raw!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https"):
        hint = f" (did you mean http://{raw}?)" if "://" not in raw else ""
        raise _BadInput(f"{source} {raw!r} is not an http:// or https:// URL{hint}")
    if not url.host:
        raise _BadInput(f"{source} {raw!r} names no host (e.g. {DEFAULT_URL})")
    return raw


def _drop_stdout() -> None:
    """Point stdout at /dev/null: its final flush at exit would raise BrokenPipeError again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


class _Interrupted(KeyboardInterrupt):
    """Ctrl-C while following a swarm this command created: its id is in the message."""

    def __init__(self, swarm_id: str) -> None:
        super().__init__(swarm_id)
        self.swarm_id = swarm_id


def _fail(status: int, message: str) -> int:
    print(f"swarm-api: {' '.join(message.split())}", file=sys.stderr)  # one line, always
    return status


def _terminal() -> bool:
    return sys.stdout.isatty()


def _console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(highlight=False, stderr=stderr)


def _lines(lines: list[str]) -> None:
    if lines:
        print("\n".join(lines), flush=True)


def _print_swarm(swarm: SwarmRead, args: argparse.Namespace) -> None:
    from swarm_api_client.report import plain_report, swarm_report

    report = swarm_report(swarm, summary=args.summary, every_row=args.every_row)
    if _terminal():
        from swarm_api_client.view import print_report

        print_report(_console(), report)
    else:
        _lines(plain_report(report))


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _outcome(swarm: SwarmRead) -> int:
    """0 when the swarm succeeded, else 1 with its error code on stderr."""
    if swarm.status == "succeeded":
        return OK
    err = swarm.error or {}
    code = err.get("code") or swarm.status
    failed = swarm.progress.failed
    also = f" ({failed} failed subtask{'s' if failed > 1 else ''})" if failed else ""
    return _fail(NOT_SUCCEEDED, f"swarm {swarm.id} {swarm.status}: {code}: "
                 f"{err.get('message', '')}".rstrip(": ") + also)


def follow(client: SwarmClient, swarm_id: str, console: Console,
           timeout: float | None = None) -> SwarmRead:
    """Show the swarm live from its event stream until it ends; returns its final state."""
    from rich.live import Live

    from swarm_api_client.view import LiveSwarm, events_in_background

    view = LiveSwarm(client.get(swarm_id))
    if view.status in TERMINAL:
        return view.snapshot
    deadline = None if timeout is None else time.monotonic() + timeout
    read_at = time.monotonic()
    events = events_in_background(client.events(swarm_id, last_event_id=None),
                                  f"events-{swarm_id}")
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


def _await(client: SwarmClient, swarm_id: str, timeout: float | None) -> SwarmRead:
    """Wait for the swarm to end: drawn live on stderr when it is a terminal, else quietly
    (a pipe or a log gets the report once, not a line per refresh)."""
    if sys.stderr.isatty():
        return follow(client, swarm_id, _console(stderr=True), timeout)
    return client.wait(swarm_id, timeout=timeout)


def _finish(client: SwarmClient, swarm: SwarmRead, args: argparse.Namespace) -> int:
    """Submit/retry: without --wait print the new swarm; with it follow, then report."""
    if not args.wait:
        if args.json:
            _print_json(swarm.model_dump(mode="json"))
        else:
            print(f"{swarm.id} {swarm.status}")
        return OK
    if swarm.status == "awaiting_approval":  # it runs once someone decides
        print(f"swarm {swarm.id} awaits approval: swarm-api approve {swarm.id} (or reject)",
              file=sys.stderr)
    timeout = getattr(args, "timeout", None)
    try:
        if args.json:
            final = client.wait(swarm.id, timeout=timeout)
            _print_json(final.model_dump(mode="json"))
            return _outcome(final)
        final = _await(client, swarm.id, timeout)
    except KeyboardInterrupt:  # the swarm was created: say which one goes on running
        raise _Interrupted(swarm.id) from None
    _print_swarm(final, args)
    return _outcome(final)


def _submit(client: SwarmClient, args: argparse.Namespace) -> int:
    body = _read_body(args.file)
    return _finish(client, client.create(body, idempotency_key=args.idempotency_key), args)


def _estimate(client: SwarmClient, args: argparse.Namespace) -> int:
    got = client.estimate(_read_body(args.file))
    if args.json:
        _print_json(got.model_dump(mode="json"))
        return OK
    from swarm_api_client.report import estimate_lines

    _lines(estimate_lines(got))
    return OK


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


def _approve(client: SwarmClient, args: argparse.Namespace) -> int:
    plan = _read_body(args.plan, plan=True) if args.plan is not None else {}
    return _finish(client, client.approve(args.id, agents=plan.get("agents"),
                                          limits=plan.get("limits")), args)


def _reject(client: SwarmClient, args: argparse.Namespace) -> int:
    swarm = client.reject(args.id, reason=args.reason)
    if args.json:
        _print_json(swarm.model_dump(mode="json"))
    else:
        print(f"{swarm.id} {swarm.status}")
    return OK


def _get(client: SwarmClient, args: argparse.Namespace) -> int:
    swarm = client.get(args.id)
    if args.result:
        if swarm.result is None:
            return _fail(NOT_SUCCEEDED, f"swarm {swarm.id} ({swarm.status}) has no result")
        sys.stdout.write(swarm.result if swarm.result.endswith("\n") else swarm.result + "\n")
        return OK
    if args.json:
        _print_json(swarm.model_dump(mode="json"))
    else:
        _print_swarm(swarm, args)
    return OK


def _watch(client: SwarmClient, args: argparse.Namespace) -> int:
    if args.json:
        status = None
        for event in client.events(args.id):
            print(event.model_dump_json(), flush=True)
            if event.event == "swarm.completed":
                status = event.data.get("status")
        return OK if status == "succeeded" else _outcome(client.get(args.id))
    final = _await(client, args.id, None)
    _print_swarm(final, args)
    return _outcome(final)


def _ls(client: SwarmClient, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise _BadInput("--limit must be at least 1")
    swarms = list(client.list(status=args.status, limit=args.limit))
    if args.json:
        _print_json([s.model_dump(mode="json") for s in swarms])
        return OK
    if not swarms:  # on stderr: a pipe reading ids gets none, not a sentence
        print("no swarms" + (f" with status {args.status}" if args.status else ""),
              file=sys.stderr)
        return OK
    if _terminal():
        from swarm_api_client.view import swarms_table

        _console().print(swarms_table(swarms))
    else:
        from swarm_api_client.report import LIST_HEADERS, columns, list_rows

        _lines(columns(LIST_HEADERS, list_rows(swarms)))
    return OK


def _cancel(client: SwarmClient, args: argparse.Namespace) -> int:
    swarm = client.cancel(args.id)
    if args.json:
        _print_json(swarm.model_dump(mode="json"))
    else:
        print(f"cancel requested: {swarm.id} {swarm.status}")
    return OK


def _erase(client: SwarmClient, args: argparse.Namespace) -> int:
    client.erase(args.id)
    if args.json:
        _print_json({"id": args.id, "erased": True})
    else:
        print(f"erased: {args.id}")
    return OK


def _usage(client: SwarmClient, args: argparse.Namespace) -> int:
    report = client.usage(start=args.start, end=args.end, group_by=args.group_by)
    if args.json:
        _print_json(report.model_dump(mode="json", by_alias=True))
    elif _terminal():
        from swarm_api_client.view import usage_table

        _console().print(usage_table(report))
    else:
        from swarm_api_client.report import USAGE_HEADERS, columns, usage_rows

        _lines(columns((report.group_by, *USAGE_HEADERS), usage_rows(report)))
    return OK


def _audit(client: SwarmClient, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise _BadInput("--limit must be at least 1")
    rows = list(client.audit_entries(start=args.start, end=args.end, action=args.action,
                                     limit=args.limit))
    if args.json:
        _print_json([r.model_dump(mode="json") for r in rows])
        return OK
    if not rows:  # on stderr, as `ls`: a pipe gets no line
        print("no audit rows", file=sys.stderr)
        return OK
    _lines([" ".join((r.time.isoformat(), r.action, r.swarm_id or "-", r.key_id or "-",
                      r.client or "-", r.request_id or "-")) for r in rows])
    return OK


_HANDLERS: dict[str, Callable[[SwarmClient, argparse.Namespace], int]] = {
    "submit": _submit, "get": _get, "ls": _ls, "watch": _watch, "cancel": _cancel,
    "retry": _retry, "erase": _erase, "approve": _approve, "reject": _reject,
    "usage": _usage, "audit": _audit, "estimate": _estimate,
}
