"""DAG checks and ordering for subtasks: pure functions, no IO."""

from __future__ import annotations

import graphlib
from collections.abc import Iterable, Mapping, Sequence


class DagError(ValueError):
    """An invalid dependency graph; `field` and `details` say where."""

    def __init__(self, code: str, message: str, details: dict[str, object]) -> None:
        super().__init__(message)
        self.code = code
        self.details = details


def find_cycle(deps: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle as a closed path [a, b, ..., a], or None when the graph is acyclic."""
    if not any(deps.values()):  # no edges (most swarms): graphlib's setup was ~2 % of a POST
        return None
    try:
        graphlib.TopologicalSorter(deps).prepare()
    except graphlib.CycleError as exc:
        cycle = list(exc.args[1])
        # graphlib lists the cycle backwards (node, its predecessor, ...): show it forwards
        return list(reversed(cycle))
    return None


def validate_dag(deps: Mapping[str, Sequence[str]], field: str = "agents") -> None:
    """Raise DagError for unknown dependencies, self-dependencies or cycles."""
    for name, ds in deps.items():
        for d in ds:
            if d not in deps:
                raise DagError(
                    "unknown_dependency",
                    f"{name!r} depends on unknown {d!r}",
                    {"field": f"{field}.{name}.depends_on", "name": name, "unknown": d},
                )
    cycle = find_cycle(deps)
    if cycle is not None:
        raise DagError(
            "dependency_cycle",
            "dependency cycle: " + " -> ".join(cycle),
            {"field": f"{field}.depends_on", "cycle": cycle},
        )


def topological_order(deps: Mapping[str, Sequence[str]], order: Iterable[str]) -> list[str]:
    """Names in dependency order; among ready nodes the given `order` decides (stable)."""
    rank = {name: i for i, name in enumerate(order)}
    if not any(deps.values()):
        # no edges (a fan-out's workers): every node is ready at once, in `order`; the sorter
        # costs ~2 us a node, paid twice between a fan-out's last commit and its
        # synthesizer's call (its inputs: the workers' results in this order)
        return sorted(deps, key=lambda n: rank.get(n, len(rank)))
    ts = graphlib.TopologicalSorter(deps)
    ts.prepare()
    out: list[str] = []
    while ts.is_active():
        ready = sorted(ts.get_ready(), key=lambda n: rank.get(n, len(rank)))
        out.extend(ready)
        ts.done(*ready)
    return out


def depth(deps: Mapping[str, Sequence[str]]) -> int:
    """Number of nodes on the longest dependency chain (1 for a flat fan-out)."""
    level: dict[str, int] = {}
    for name in topological_order(deps, deps):
        level[name] = 1 + max((level[d] for d in deps[name]), default=0)
    return max(level.values(), default=0)


def descendants(deps: Mapping[str, Sequence[str]], roots: Iterable[str]) -> set[str]:
    """Every node that depends, directly or not, on one of `roots`."""
    children: dict[str, list[str]] = {n: [] for n in deps}
    for n, ds in deps.items():
        for d in ds:
            children.setdefault(d, []).append(n)
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        for c in children.get(stack.pop(), []):
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return seen


def critical_path(deps: Mapping[str, Sequence[str]], weight: Mapping[str, float]) -> float:
    """Longest sum of weights along a dependency chain."""
    if not weight:  # nothing has run (a new swarm's view)
        return 0.0
    if not any(deps.values()):  # a plain fan-out: no chain is longer than its longest node
        return max(weight.values())
    # graphlib orders only the nodes with dependencies: a leaf's chain is its own weight, and
    # a fan-out's synthesizer over 100 workers sorts one node, not 101 (its ended view is
    # built while its end commits: docs/decisions/0036-fan-out-latency-path.md)
    inner = {n: [d for d in ds if deps.get(d)] for n, ds in deps.items() if ds}
    best = {n: weight.get(n, 0.0) for n, ds in deps.items() if not ds}
    for name in graphlib.TopologicalSorter(inner).static_order():
        best[name] = weight.get(name, 0.0) + max(
            (best.get(d, weight.get(d, 0.0)) for d in deps[name]), default=0.0)
    return max(best.values(), default=0.0)


def chain_below(deps: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """For each node, the number of nodes on the longest chain from it through its dependents
    (1 for a node nothing depends on): how much work still waits behind it."""
    children: dict[str, list[str]] = {n: [] for n in deps}
    for n, ds in deps.items():
        for d in ds:
            children.setdefault(d, []).append(n)
    below: dict[str, int] = {}
    for name in reversed(topological_order(deps, deps)):
        below[name] = 1 + max((below[c] for c in children.get(name, [])), default=0)
    return below
