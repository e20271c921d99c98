"""What the CLI shows: the live view of a running swarm and the tables (rich)."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal

from rich.console import Console, Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from app.schemas import SwarmEvent, SwarmRead, UsageReport

_STYLE = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "skipped": "dim",
          "running": "cyan", "pending": "white"}
_EVENT_STATUS = {"subtask.started": "running", "subtask.succeeded": "succeeded",
                 "subtask.failed": "failed", "subtask.skipped": "skipped"}
_DONE = ("succeeded", "failed", "skipped", "cancelled")


def _elapsed(swarm: SwarmRead) -> float:
    end = swarm.finished_at or datetime.now(UTC)
    return max((end - swarm.created_at).total_seconds(), 0.0)


def _usd(value: str) -> str:
    amount = Decimal(value)  # cents would hide what a cheap subtask costs
    return f"${amount:.6f}" if amount < 1 else f"${amount:,.2f}"


class LiveSwarm:
    """A running swarm as the event stream tells it: a renderable re-drawn by `rich.Live`
    (elapsed time moves between events). `snapshot` is the last full read (spend, new
    subtasks); events update the subtasks' statuses in between."""

    def __init__(self, snapshot: SwarmRead) -> None:
        self.statuses: dict[str, str] = {}
        self.status = snapshot.status
        self.snapshot = snapshot
        self.refresh(snapshot)

    def refresh(self, snapshot: SwarmRead) -> None:
        self.snapshot = snapshot
        self.status = snapshot.status
        self.statuses = {s.name: s.status for s in snapshot.subtasks}
        self.stale = False

    def apply(self, event: SwarmEvent) -> None:
        """Fold one event in; a subtask not seen yet (a planned one) marks the view stale."""
        if event.event in ("swarm.status", "swarm.completed"):
            self.status = str(event.data.get("status", self.status))
        name = event.data.get("name")
        if event.event in _EVENT_STATUS and isinstance(name, str):
            self.stale = self.stale or name not in self.statuses
            self.statuses[name] = _EVENT_STATUS[event.event]

    def __rich__(self) -> RenderableType:
        counts = Counter(self.statuses.values())
        total = len(self.statuses)
        done = sum(counts[s] for s in _DONE)
        running = sorted(n for n, s in self.statuses.items() if s == "running")
        head = Text.assemble(
            (f"swarm {self.snapshot.id} ", "bold"), (self.status, _STYLE.get(self.status, "")),
            f"   elapsed {_elapsed(self.snapshot):.1f}s",
            f"   spent {_usd(self.snapshot.usage.cost_usd)}")
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=max(total, 1), completed=done, width=40),
                    Text(f"{done}/{total} subtasks"
                         + "".join(f", {counts[s]} {s}" for s in ("failed", "skipped")
                                   if counts[s])))
        shown = ", ".join(running[:8]) + (f" … (+{len(running) - 8})" if len(running) > 8 else "")
        agents = Text(f"running ({len(running)}): {shown or '-'}", style="cyan")
        return Group(head, bar, agents)


def summary_table(swarm: SwarmRead) -> Table:
    """One row per subtask: status, model, attempts, latency, cost."""
    table = Table(title=None, show_edge=False, header_style="bold")
    table.add_column("subtask", no_wrap=True)
    table.add_column("status")
    table.add_column("model")
    table.add_column("attempts", justify="right")
    table.add_column("latency", justify="right")
    table.add_column("cost", justify="right")
    for s in swarm.subtasks:
        latency = f"{s.latency_ms / 1000:.2f}s" if s.latency_ms is not None else "-"
        table.add_row(s.name, Text(s.status, style=_STYLE.get(s.status, "")), s.model,
                      str(s.attempts), latency, _usd(s.usage.cost_usd))
    return table


def print_summary(console: Console, swarm: SwarmRead) -> None:
    """The finished (or current) swarm: a header line, the table, the error, the result."""
    wall = swarm.timing.wall_s if swarm.timing.wall_s is not None else _elapsed(swarm)
    console.print(Text.assemble(
        (f"swarm {swarm.id} ", "bold"), (swarm.status, _STYLE.get(swarm.status, "bold")),
        f" in {wall:.1f}s · {_usd(swarm.usage.cost_usd)} · "
        f"{swarm.usage.gateway_calls} gateway calls · "
        f"{swarm.progress.succeeded}/{swarm.progress.total} subtasks succeeded"))
    console.print(summary_table(swarm))
    if swarm.error:
        console.print(Text(f"error: {swarm.error.get('code')}: {swarm.error.get('message')}",
                           style="red"))
    if swarm.result is not None:
        console.print(Text("result:", style="bold"))
        console.print(Text(swarm.result), soft_wrap=True)


def swarms_table(swarms: list[SwarmRead]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    table.add_column("id", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("progress", justify="right", no_wrap=True)
    table.add_column("cost", justify="right", no_wrap=True)
    table.add_column("age", justify="right", no_wrap=True)
    table.add_column("task", overflow="ellipsis", no_wrap=True, max_width=40)
    now = time.time()
    for s in swarms:
        age = now - s.created_at.timestamp()
        table.add_row(s.id, Text(s.status, style=_STYLE.get(s.status, "")),
                      f"{s.progress.succeeded}/{s.progress.total}", _usd(s.usage.cost_usd),
                      _age(age), s.task.replace("\n", " "))
    return table


def _age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def usage_table(report: UsageReport) -> Table:
    table = Table(show_edge=False, header_style="bold", show_footer=True)
    figures = report.total
    table.add_column(report.group_by, footer="total", no_wrap=True)
    table.add_column("calls", justify="right", footer=str(figures.gateway_calls))
    table.add_column("prompt tokens", justify="right", footer=str(figures.prompt_tokens))
    table.add_column("completion tokens", justify="right", footer=str(figures.completion_tokens))
    table.add_column("cost", justify="right", footer=f"${figures.cost_usd}")
    for item in report.items:
        table.add_row(item.key, str(item.gateway_calls), str(item.prompt_tokens),
                      str(item.completion_tokens), f"${item.cost_usd}")
    return table
