"""The fan-out's way from its last answer to its synthesizer's call, and its ended view, sort no
graph: a fan-out's workers have no edges (`dag.topological_order` orders them by position), and
the view's critical path is walked depth first (`dag.critical_path`); graphlib's sorter was
~0.3 ms of each on 100 workers (docs/decisions/0036-fan-out-latency-path.md)."""

from __future__ import annotations

import pytest

from app.engine import dag

WORKERS = [f"agent_{i}" for i in range(100)]


class _NoSorter:
    def __init__(self, *args: object) -> None:
        raise AssertionError("graphlib's sorter on a fan-out's path")


def test_a_fan_out_is_ordered_and_measured_without_a_sorter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dag.graphlib, "TopologicalSorter", _NoSorter)
    flat = {w: [] for w in reversed(WORKERS)}
    assert dag.topological_order(flat, WORKERS) == WORKERS
    deps = {**{w: [] for w in WORKERS}, "synthesizer": list(WORKERS)}
    weight = dict.fromkeys(WORKERS, 0.5) | {"synthesizer": 0.25}
    assert dag.critical_path(deps, weight) == 0.75
