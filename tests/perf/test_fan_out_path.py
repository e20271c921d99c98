"""The fan-out's way from its last answer to its synthesizer's call, and its ended view, sort
no fan-out's workers: they have no edges (`dag.topological_order` orders them by position), and
the view's critical path sorts only the nodes with dependencies (`dag.critical_path`);
graphlib's sorter was ~0.3 ms of each on 100 workers
(docs/decisions/0036-fan-out-latency-path.md)."""

from __future__ import annotations

import graphlib
from typing import Any, ClassVar

import pytest

from app.engine import dag

WORKERS = [f"agent_{i}" for i in range(100)]


class _CountingSorter(graphlib.TopologicalSorter[str]):
    sorted_nodes: ClassVar[list[set[str]]] = []

    def __init__(self, graph: dict[str, Any]) -> None:
        super().__init__(graph)
        nodes = set(graph) | {d for ds in graph.values() for d in ds}
        _CountingSorter.sorted_nodes.append(nodes)


def test_a_fan_out_is_ordered_and_measured_without_sorting_its_workers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _CountingSorter.sorted_nodes = []
    monkeypatch.setattr(dag.graphlib, "TopologicalSorter", _CountingSorter)
    flat = {w: [] for w in reversed(WORKERS)}
    assert dag.topological_order(flat, WORKERS) == WORKERS
    assert _CountingSorter.sorted_nodes == []
    deps = {**{w: [] for w in WORKERS}, "synthesizer": list(WORKERS)}
    weight = dict.fromkeys(WORKERS, 0.5) | {"synthesizer": 0.25}
    assert dag.critical_path(deps, weight) == 0.75
    assert _CountingSorter.sorted_nodes == [{"synthesizer"}]
