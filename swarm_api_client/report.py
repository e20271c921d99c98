"""What the CLI prints about swarms, as plain text: whole values in aligned columns (for pipes,
files and `grep`), a swarm's report kept short at any size (a thousand subtasks are counted,
not listed, unless asked), failed subtasks with their reasons, and long results cut with a
pointer to the command that prints them whole. `view.py` draws the same on a terminal."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from app.estimate_schemas import SwarmEstimate
from app.schemas import SwarmRead, UsageReport

SUBTASK_ROWS = 50  # a swarm with more subtasks is summarised unless --all
FAILED_ROWS = 20  # failed subtasks listed by name, the rest counted
RESULT_LINES = 40  # a longer result is cut, with the command that prints it whole
RESULT_CHARS = 8_000
STATUS_ORDER = ("succeeded", "failed", "skipped", "cancelled", "running", "pending")
SUBTASK_HEADERS = ("subtask", "status", "model", "attempts", "latency", "cost", "error")


def usd(value: str) -> str:
    """The exact decimal the service answers: rounding would hide what a cheap call costs."""
    return f"${value}"


def age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def elapsed(swarm: SwarmRead) -> float:
    end = swarm.finished_at or datetime.now(UTC)
    return max((end - swarm.created_at).total_seconds(), 0.0)


def reason(error: dict[str, object] | None) -> str:
    """`code: message` of an error object, on one line."""
    if not error:
        return ""
    text = f"{error.get('code') or 'error'}: {error.get('message') or ''}".rstrip(": ")
    return " ".join(text.split())


def columns(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Aligned plain columns, every value whole; the last column is not padded."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    out = []
    for row in (headers, *rows):
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)]
        out.append("  ".join([*cells, row[-1]]).rstrip())
    return out


@dataclass
class SwarmReport:
    """A swarm as the CLI tells it; `rows` is None when the subtasks are only counted."""

    header: str
    counts: str
    rows: list[tuple[str, ...]] | None
    hidden_rows: str | None
    failed: list[tuple[str, str]]
    more_failed: str | None
    error: str | None
    result: list[str] = field(default_factory=list)
    result_cut: str | None = None


def swarm_report(swarm: SwarmRead, *, summary: bool = False, every_row: bool = False
                 ) -> SwarmReport:
    """The report of `get`, `submit --wait`, `watch` and `retry --wait`."""
    wall = swarm.timing.wall_s if swarm.timing.wall_s is not None else elapsed(swarm)
    p = swarm.progress
    header = (f"swarm {swarm.id} {swarm.status} in {wall:.1f}s · {usd(swarm.usage.cost_usd)} · "
              f"{swarm.usage.gateway_calls} gateway calls · "
              f"{p.succeeded}/{p.total} subtasks succeeded")
    by_status = Counter(s.status for s in swarm.subtasks)
    order = [*STATUS_ORDER, *sorted(set(by_status) - set(STATUS_ORDER))]
    counts = "subtasks: " + ", ".join(f"{by_status[s]} {s}" for s in order if by_status[s])
    reused = sum(s.reused for s in swarm.subtasks)
    counts += f" ({reused} reused from {swarm.retry_of})" if reused else ""
    rows: list[tuple[str, ...]] | None = None
    hidden = None
    if not summary and (every_row or len(swarm.subtasks) <= SUBTASK_ROWS):
        rows = [(s.name, s.status + (" (reused)" if s.reused else "")
                 + (f" ({s.output_status} output)" if s.output_status not in (None, "valid")
                    else ""),
                 s.model + (f" (after {s.fallbacks} fallback{'s' if s.fallbacks > 1 else ''})"
                            if s.fallbacks else ""),
                 str(s.attempts),
                 f"{s.latency_ms / 1000:.2f}s" if s.latency_ms is not None else "-",
                 usd(s.usage.cost_usd), reason(s.error) or "-")
                for s in swarm.subtasks]
    elif not summary:
        hidden = (f"{len(swarm.subtasks)} subtasks: `swarm-api get {swarm.id} --all` lists "
                  "every one")
    failed = [(s.name, reason(s.error) or s.status) for s in swarm.subtasks
              if s.status == "failed"]
    more = None
    if len(failed) > FAILED_ROWS:
        more = (f"… and {len(failed) - FAILED_ROWS} more failed subtasks "
                f"(`swarm-api get {swarm.id} --json` has every error)")
        failed = failed[:FAILED_ROWS]
    report = SwarmReport(header, counts, rows, hidden, failed, more,
                         reason(swarm.error) or None)
    if swarm.result is not None and not summary:
        report.result, report.result_cut = cut_result(swarm.id, swarm.result)
    return report


def cut_result(swarm_id: str, result: str) -> tuple[list[str], str | None]:
    """The result's first lines, and what was left out (None when nothing was)."""
    lines = result.splitlines()
    kept, size = [], 0
    for line in lines[:RESULT_LINES]:
        if size + len(line) > RESULT_CHARS:
            kept.append(line[: max(RESULT_CHARS - size, 0)])
            break
        kept.append(line)
        size += len(line) + 1
    shown = sum(len(line) + 1 for line in kept)
    if len(kept) == len(lines) and shown >= len(result):
        return kept, None
    left = max(len(result) - shown, 0)
    return kept, (f"… result cut: {left} more characters, {len(result)} in all "
                  f"(`swarm-api get {swarm_id} --result` prints it whole)")


def plain_report(report: SwarmReport) -> list[str]:
    out = [report.header, report.counts]
    if report.rows is not None:
        out += columns(SUBTASK_HEADERS, report.rows)
    if report.hidden_rows:
        out.append(report.hidden_rows)
    if report.failed and report.rows is None:  # else the table's error column has them
        out.append(f"failed subtasks ({len(report.failed)}"
                   f"{'+' if report.more_failed else ''}):")
        out += [f"  {line}" for line in columns(("subtask", "reason"), report.failed)[1:]]
        if report.more_failed:
            out.append(f"  {report.more_failed}")
    if report.error:
        out.append(f"error: {report.error}")
    if report.result:
        out += ["result:", *report.result]
    if report.result_cut:
        out.append(report.result_cut)
    return out


LIST_HEADERS = ("id", "status", "succeeded", "cost", "age", "task")


def list_rows(swarms: Sequence[SwarmRead]) -> list[tuple[str, ...]]:
    now = time.time()
    return [(s.id, s.status, f"{s.progress.succeeded}/{s.progress.total}",
             usd(s.usage.cost_usd), age(now - s.created_at.timestamp()),
             " ".join(s.task.split())) for s in swarms]


USAGE_HEADERS = ("calls", "prompt_tokens", "completion_tokens", "cost_usd")


def usage_rows(report: UsageReport) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [(item.key, str(item.gateway_calls), str(item.prompt_tokens),
             str(item.completion_tokens), item.cost_usd) for item in report.items]
    t = report.total
    rows.append(("total", str(t.gateway_calls), str(t.prompt_tokens), str(t.completion_tokens),
                 t.cost_usd))
    return rows


def estimate_lines(e: SwarmEstimate) -> list[str]:
    """An estimate as plain lines, every value whole."""
    fits = "  ".join(f"{k} {'yes' if v else 'no'}" for k, v in e.fits.model_dump().items())
    since = e.basis.since.isoformat() if e.basis.since is not None else "-"
    lines = [f"plan {len(e.plan.agents)} agents width {e.width} depth {e.depth}",
             f"calls expected {e.calls.expected:g} max {e.calls.max}",
             f"tokens expected {e.tokens.expected} max {e.tokens.max}",
             f"cost_usd expected {e.cost_usd.expected} p90 {e.cost_usd.p90} "
             f"max {e.cost_usd.max}",
             f"reservation_usd {e.reservation_usd}", f"fits {fits}",
             f"basis samples {e.basis.samples} since {since}"]
    if e.planning_cost_usd is not None:
        lines.append(f"planning_cost_usd {e.planning_cost_usd}")
    return lines
