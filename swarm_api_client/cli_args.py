"""The `swarm-api` console script's arguments and help: what each command does, examples,
exit statuses and environment variables (`swarm-api --help`, `swarm-api submit --help`)."""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version
from typing import get_args

from app.schemas import AuditAction
from swarm_api_client._base import DEFAULT_URL, TERMINAL
from swarm_api_client.report import SUBTASK_ROWS

OK, NOT_SUCCEEDED, REFUSED, UNREACHABLE, KEY_REFUSED, INTERRUPTED = 0, 1, 2, 3, 4, 130
COMMANDS = ("submit", "get", "ls", "watch", "cancel", "retry", "erase", "approve", "reject",
            "usage", "audit", "estimate")

EXIT_STATUSES = f"""\
exit statuses (client commands):
  {OK}    done; with --wait, watch: the swarm succeeded
  {NOT_SUCCEEDED}    the swarm failed or was cancelled (its error on stderr), or did not end in
       time (--timeout)
  {REFUSED}    bad usage (a malformed --url, an unreadable or invalid file) or a request the
       service refused (a 4xx: its error code on stderr)
  {UNREACHABLE}    the service cannot be reached (or answers 5xx)
  {KEY_REFUSED}    the service refused the API key (401/403)
  {INTERRUPTED}  interrupted (Ctrl-C stops the client, never the swarm)
Every error is one line on stderr."""

ENVIRONMENT = f"""\
environment:
  SWARM_URL      the service of the client commands (default {DEFAULT_URL}; --url wins)
  SWARM_API_KEY  sent as `Authorization: Bearer` (needed when the service sets SWARM_API_KEYS)
  SWARM_*        the settings of serve/worker/migrate (docs/OPERATIONS.md, "Configuration")"""

DESCRIPTION = """\
Swarm API: run LLM agent swarms over an OpenAI-compatible gateway.

Server commands run the service (serve, worker, migrate, simulator) or its database (prune);
client commands talk to a running service over HTTP (submit, get, ls, watch, cancel, retry,
erase, approve, reject, usage, audit, estimate). Written to a pipe or a file, client
commands print plain columns with every value whole; --json prints JSON."""

EXAMPLES = """\
examples:
  swarm-api serve                                  # API + engine on http://127.0.0.1:8000
  swarm-api submit examples/dag.json --wait        # start a swarm, follow it, print the result
  swarm-api submit - < body.json                   # the body from stdin: prints `<id> <status>`
  swarm-api ls --status failed --limit 5           # newest first
  swarm-api get ID --summary                       # counts and failures, no table
  swarm-api get ID --result > result.md            # the whole result, nothing else
  swarm-api retry ID --wait --limits '{"failure_tolerance": 0.5}'
  swarm-api usage --group-by day --json
  swarm-api estimate examples/dag.json             # the plan and its cost, nothing created"""


def package_version() -> str:
    try:
        return version("swarm-api")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def root_parser() -> tuple[argparse.ArgumentParser,
                           argparse._SubParsersAction[argparse.ArgumentParser]]:
    """The script's parser with its help and --version; the caller adds the server commands,
    `add_commands` the client ones."""
    parser = argparse.ArgumentParser(
        prog="swarm-api", description=DESCRIPTION,
        epilog="\n\n".join([EXAMPLES, EXIT_STATUSES, ENVIRONMENT]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"swarm-api {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    return parser, sub


def _command(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
             common: argparse.ArgumentParser, summary: str, examples: str
             ) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, parents=[common], help=summary, description=summary,
        epilog=f"examples:\n{examples}\n\n{EXIT_STATUSES}\n\n{ENVIRONMENT}",
        formatter_class=argparse.RawDescriptionHelpFormatter)


def _report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--summary", action="store_true",
                   help="the status line, counts by status and the failed subtasks only")
    p.add_argument("--all", action="store_true", dest="every_row",
                   help=f"a row for every subtask, however many (default: a table up to "
                   f"{SUBTASK_ROWS} subtasks, counts beyond)")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the client commands to the console script's sub-parsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None,
                        help=f"the service, an http:// or https:// URL (default: $SWARM_URL "
                        f"or {DEFAULT_URL}); the API key comes from $SWARM_API_KEY")
    common.add_argument("--json", action="store_true",
                        help="print JSON (for scripts) instead of columns")

    p = _command(sub, "submit", common, "start a swarm from a JSON file (- reads stdin)",
                 "  swarm-api submit examples/dag.json             # prints `<id> <status>`\n"
                 "  swarm-api submit examples/planned.json --wait  # live progress, then the "
                 "report\n  swarm-api submit - --wait --json < body.json   # the final swarm "
                 "as JSON")
    p.add_argument("file", help="the request body of POST /swarms, as JSON; - reads stdin")
    p.add_argument("--wait", action="store_true",
                   help="follow it until it ends (live on a terminal), then print its report")
    p.add_argument("--idempotency-key", default=None, help="default: a new one")
    p.add_argument("--timeout", type=float, default=None, help="give up waiting after S seconds")
    _report_flags(p)

    p = _command(sub, "get", common, "show a swarm: status, cost, subtasks, failures, result",
                 "  swarm-api get ID\n  swarm-api get ID --summary\n"
                 "  swarm-api get ID --result > result.md")
    p.add_argument("id")
    _report_flags(p)
    p.add_argument("--result", action="store_true",
                   help="print only the swarm's result, whole (exit 1 when it has none)")

    p = _command(sub, "ls", common, "list swarms, newest first",
                 "  swarm-api ls\n  swarm-api ls --status failed --limit 100 | cut -d' ' -f1")
    p.add_argument("--status", default=None,
                   choices=["queued", "planning", "awaiting_approval", "running", "synthesizing",
                            *sorted(TERMINAL)])
    p.add_argument("--limit", type=int, default=20, help="at most N swarms (default 20)")

    p = _command(sub, "watch", common,
                 "follow a swarm until it ends (--json: one event per line)",
                 "  swarm-api watch ID\n  swarm-api watch ID --json | grep subtask.failed")
    p.add_argument("id")
    _report_flags(p)

    p = _command(sub, "cancel", common, "cancel a swarm (its finished outputs are kept)",
                 "  swarm-api cancel ID")
    p.add_argument("id")

    p = _command(sub, "retry", common,
                 "run a failed or cancelled swarm again as a new swarm (what succeeded is "
                 "reused)",
                 "  swarm-api retry ID --wait\n"
                 "  swarm-api retry ID --limits '{\"budget_usd\": 5}'")
    p.add_argument("id")
    p.add_argument("--wait", action="store_true", help="follow the new swarm until it ends")
    p.add_argument("--limits", default=None, metavar="JSON",
                   help='the new run\'s limits, e.g. \'{"failure_tolerance": 0.5}\' (keys left '
                   "out keep the old run's values)")
    _report_flags(p)

    p = _command(sub, "erase", common,
                 "erase an ended swarm's content for good (its usage and status stay)",
                 "  swarm-api erase ID")
    p.add_argument("id")
    p = _command(sub, "estimate", common,
                 "what a swarm of this body would do and cost, creating nothing (without "
                 "agents the planner runs, billed)",
                 "  swarm-api estimate examples/dag.json\n"
                 "  swarm-api estimate planned.json --json | jq .plan > plan.json")
    p.add_argument("file", help="the request body of POST /swarms, as JSON; - reads stdin")

    p = _command(sub, "approve", common,
                 "let a swarm awaiting approval run (with --plan: exactly that plan)",
                 "  swarm-api approve ID\n  swarm-api get ID --json | jq .plan > plan.json  "
                 "# edit it, then\n  swarm-api approve ID --plan plan.json --wait")
    p.add_argument("id")
    p.add_argument("--plan", default=None, metavar="FILE",
                   help='the plan to run: {"agents": [...]} as the swarm shows it (optionally '
                   'with "limits"), or a list of agents; - reads stdin')
    p.add_argument("--wait", action="store_true", help="follow the swarm until it ends")
    _report_flags(p)

    p = _command(sub, "reject", common, "end a swarm awaiting approval (cancelled, rejected)",
                 "  swarm-api reject ID --reason 'too many agents'")
    p.add_argument("id")
    p.add_argument("--reason", default=None, help="said in the swarm's error")

    p = _command(sub, "usage", common, "spend and tokens from the ledger",
                 "  swarm-api usage\n  swarm-api usage --from 2026-12-01 --group-by day")
    p.add_argument("--from", dest="start", default=None, help="ISO date or datetime (inclusive)")
    p.add_argument("--to", dest="end", default=None, help="ISO date or datetime (exclusive)")
    p.add_argument("--group-by", default="model", choices=["model", "day", "tenant"])

    p = _command(sub, "audit", common, "who changed what: the tenant's audit trail, newest first",
                 "  swarm-api audit\n  swarm-api audit --from 2026-12-01 --action cancel")
    p.add_argument("--from", dest="start", default=None, help="ISO date or datetime (inclusive)")
    p.add_argument("--to", dest="end", default=None, help="ISO date or datetime (exclusive)")
    p.add_argument("--action", default=None, choices=list(get_args(AuditAction)))
    p.add_argument("--limit", type=int, default=50, help="at most N rows (default 50)")
