"""What the CLI shows on a terminal (rich): the live view of a running swarm, and the
reports and tables of `report.py`, coloured."""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Iterable

from rich.console import Console, Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from app.schemas import SwarmEvent, SwarmRead, UsageReport
from swarm_api_client.report import (
    LIST_HEADERS,
    SUBTASK_HEADERS,
    USAGE_HEADERS,
    SwarmReport,
    elapsed,
    list_rows,
    usage_rows,
    usd,
)

_STYLE = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "skipped": "dim",
          "running": "cyan", "pending": "white"}
_EVENT_STATUS = {"subtask.started": "running", "subtask.succeeded": "succeeded",
                 "subtask.failed": "failed", "subtask.skipped": "skipped"}
_DONE = ("succeeded", "failed", "skipped", "cancelled")
_NUMERIC = ("attempts", "latency", "cost")


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
            f"   elapsed {elapsed(self.snapshot):.1f}s",
            f"   spent {usd(self.snapshot.usage.cost_usd)}")
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=max(total, 1), completed=done, width=40),
                    Text(f"{done}/{total} subtasks"
                         + "".join(f", {counts[s]} {s}" for s in ("failed", "skipped")
                                   if counts[s])))
        shown = ", ".join(running[:8]) + (f" … (+{len(running) - 8})" if len(running) > 8 else "")
        agents = Text(f"running ({len(running)}): {shown or '-'}", style="cyan")
        return Group(head, bar, agents)


def print_report(console: Console, report: SwarmReport) -> None:
    """A swarm's report on a terminal: the plain report's parts, coloured, in a table."""
    status = report.header.split()[2]
    console.print(Text(report.header, style="bold"), style=_STYLE.get(status, ""))
    console.print(report.counts)
    if report.rows is not None:
        table = Table(show_edge=False, header_style="bold")
        for name in SUBTASK_HEADERS:
            table.add_column(name, justify="right" if name in _NUMERIC else "left",
                             no_wrap=name != "error", overflow="fold")
        for row in report.rows:
            table.add_row(*row[:1], Text(row[1], style=_STYLE.get(row[1].split()[0], "")),
                          *row[2:])
        console.print(table)
    if report.hidden_rows:
        console.print(report.hidden_rows, style="dim")
    if report.failed and report.rows is None:
        console.print(Text(f"failed subtasks ({len(report.failed)}"
                           f"{'+' if report.more_failed else ''}):", style="red"))
        for name, why in report.failed:
            console.print(f"  {name}  {why}", soft_wrap=True)
        if report.more_failed:
            console.print(f"  {report.more_failed}", style="dim")
    if report.error:
        console.print(Text(f"error: {report.error}", style="red"))
    if report.result:
        console.print(Text("result:", style="bold"))
        console.print(Text("\n".join(report.result)), soft_wrap=True)
    if report.result_cut:
        console.print(report.result_cut, style="dim")


def swarms_table(swarms: list[SwarmRead]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for name in LIST_HEADERS:
        # ids and figures are never cut; only the task folds on a narrow terminal
        table.add_column(name, no_wrap=name != "task", overflow="fold",
                         justify="right" if name in ("succeeded", "cost", "age") else "left")
    for row in list_rows(swarms):
        table.add_row(row[0], Text(row[1], style=_STYLE.get(row[1], "")), *row[2:])
    return table


def usage_table(report: UsageReport) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for name in (report.group_by, *USAGE_HEADERS):
        table.add_column(name, no_wrap=True, justify="left" if name == report.group_by
                         else "right")
    rows = usage_rows(report)
    for i, row in enumerate(rows):
        table.add_row(*row, style="bold" if i == len(rows) - 1 else None)
    return table


def events_in_background(events: Iterable[SwarmEvent], name: str
                         ) -> queue.Queue[SwarmEvent | BaseException]:
    """A swarm's events, read by a daemon thread into a queue (an error, last, as itself):
    the reader may block on a quiet stream while the live view keeps time."""
    out: queue.Queue[SwarmEvent | BaseException] = queue.Queue()

    def read() -> None:
        try:
            for event in events:
                out.put(event)
        except BaseException as exc:  # handed to the view's thread, which raises it
            out.put(exc)

    threading.Thread(target=read, name=name, daemon=True).start()
    return out
