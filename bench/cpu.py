"""CPU seconds of this machine's processes from /proc: a process with its children, and
PostgreSQL's backends (what a request costs each side of the two cores)."""

from __future__ import annotations

import os
from pathlib import Path


def _processes() -> dict[int, tuple[int, str, int]]:
    """Every process of this machine: pid -> (parent pid, name, user + system CPU ticks)."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, _, rest = stat.read_text().rpartition(")")
        except OSError:  # gone since the listing
            continue
        fields = rest.split()
        table[int(stat.parent.name)] = (int(fields[1]), head.partition("(")[2],
                                        int(fields[11]) + int(fields[12]))
    return table


def cpu_s(pid: int) -> float:
    """User + system CPU seconds so far of a process and its children (`serve --workers N`:
    the worker processes do the work, their parent only watches them)."""
    procs = _processes()
    tree, grew = {pid}, True
    while grew:
        more = {p for p, (parent, _, _) in procs.items() if parent in tree} - tree
        grew, tree = bool(more), tree | more
    return sum(procs[p][2] for p in tree if p in procs) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_s() -> float:
    """CPU seconds so far of every PostgreSQL process of this machine (the database's share of
    a request; backends that exit in between are missed, so it is a lower bound)."""
    ticks = sum(t for _, name, t in _processes().values() if name == "postgres")
    return ticks / os.sysconf("SC_CLK_TCK")
