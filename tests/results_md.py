"""Shared by `make bench` (bench/bench_table.py) and its test: the performance table of
bench/RESULTS.md as rows, rendered for one build (its figures beside the peers measured in the
same run) or for several (a column per build), and rewritten in place as the file's "The
performance table" section, the rest of the file kept."""

from __future__ import annotations

import re
from dataclasses import dataclass

HEADING = "## The performance table"
# the section runs from its heading (a line, whatever follows the title) to the next `## `
_SECTION = re.compile(rf"^{re.escape(HEADING)}\b.*?(?=^## |\Z)", re.M | re.S)
_NEXT_HEADING = re.compile(r"^## ", re.M)


@dataclass(frozen=True)
class Row:
    """One workload: swarm-api's figure, its peers' from the same run, and its goal."""

    workload: str
    ours: str
    peers: str = "-"
    target: str = "-"


def render(builds: dict[str, list[Row]]) -> list[str]:
    """The table's lines: one build as `swarm-api | peers, same run`; several, one column per
    build (each cell that build's figure with the peers of its own run), workloads in the
    order they were first measured, a workload a build lacks marked as not measured."""
    if len(builds) == 1:
        [(name, rows)] = builds.items()
        ours = f"swarm-api (`{name}`)" if name else "swarm-api"
        return [f"| workload | {ours} | peers, same run | target |", "|---|---|---|---|",
                *(f"| {r.workload} | {r.ours} | {r.peers} | {r.target} |" for r in rows)]
    by_build = {name: {r.workload: r for r in rows} for name, rows in builds.items()}
    order: dict[str, str] = {}  # workload -> target, first build's
    for rows in builds.values():
        for r in rows:
            order.setdefault(r.workload, r.target)
    names = list(builds)
    lines = ["| workload | " + " | ".join(f"`{n}`" for n in names) + " | target |",
             "|---|" + "---|" * len(names) + "---|"]
    for workload, target in order.items():
        cells = [_cell(by_build[n].get(workload)) for n in names]
        lines.append(f"| {workload} | " + " | ".join(cells) + f" | {target} |")
    return lines


def _cell(row: Row | None) -> str:
    if row is None:
        return "not measured"
    return row.ours if row.peers == "-" else f"{row.ours}; peers: {row.peers}"


def section(intro: str, builds: dict[str, list[Row]]) -> str:
    """The whole section: heading, what was run (command, date, load), the table."""
    return "\n".join([HEADING, "", intro.strip(), "", *render(builds)]) + "\n"


def rewrite(text: str, new_section: str) -> str:
    """`text` (bench/RESULTS.md) with its performance table section replaced by
    `new_section`, every other line kept; without one, the section goes before the first
    `## ` heading (or at the end)."""
    body = new_section.rstrip("\n") + "\n\n"
    if _SECTION.search(text):
        out = _SECTION.sub(lambda _: body, text, count=1)
    elif (first := _NEXT_HEADING.search(text)) is not None:
        out = text[:first.start()] + body + text[first.start():]
    else:
        out = text.rstrip("\n") + ("\n\n" if text.strip() else "") + body
    return out.rstrip("\n") + "\n"
