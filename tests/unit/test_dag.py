"""DAG checks and ordering (app/engine/dag.py) without a database."""

from __future__ import annotations

import graphlib
import itertools
import random

import pytest

from app.engine import dag

DIAMOND = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": []}


def test_cycles_are_found_and_shown_forwards() -> None:
    assert dag.find_cycle(DIAMOND) is None
    cycle = dag.find_cycle({"a": ["c"], "b": ["a"], "c": ["b"]})
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    # read forwards: each node is followed by the one it depends on
    deps = {"a": ["c"], "b": ["a"], "c": ["b"]}
    assert all(y in deps[x] for x, y in itertools.pairwise(cycle))


def test_validate_names_the_field() -> None:
    with pytest.raises(dag.DagError) as unknown:
        dag.validate_dag({"a": ["zz"]})
    assert unknown.value.code == "unknown_dependency"
    assert unknown.value.details == {"field": "agents.a.depends_on", "name": "a",
                                     "unknown": "zz"}
    with pytest.raises(dag.DagError) as cyc:
        dag.validate_dag({"a": ["a"]}, field="subtasks")
    assert cyc.value.code == "dependency_cycle"
    assert cyc.value.details["field"] == "subtasks.depends_on"
    dag.validate_dag(DIAMOND)  # valid: no exception


def test_topological_order_is_stable_by_the_given_order() -> None:
    assert dag.topological_order(DIAMOND, ["e", "a", "c", "b", "d"]) == ["e", "a", "c", "b", "d"]
    assert dag.topological_order(DIAMOND, ["a", "b", "c", "d", "e"]) == ["a", "e", "b", "c", "d"]


def test_depth_descendants_and_critical_path() -> None:
    assert dag.depth({}) == 0
    assert dag.depth({"x": [], "y": []}) == 1
    assert dag.depth(DIAMOND) == 3
    assert dag.descendants(DIAMOND, ["a"]) == {"b", "c", "d"}
    assert dag.descendants(DIAMOND, ["d", "e"]) == set()
    weights = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 1.0, "e": 6.5}
    assert dag.critical_path(DIAMOND, weights) == 7.0  # a -> b -> d
    assert dag.critical_path(DIAMOND, {"e": 9.0}) == 9.0


def test_critical_path_of_a_new_swarm_and_of_a_plain_fan_out() -> None:
    assert dag.critical_path(DIAMOND, {}) == 0.0  # nothing has run
    flat = {f"w{i}": [] for i in range(5)}
    assert dag.critical_path(flat, {"w1": 0.5, "w3": 2.5}) == 2.5
    assert dag.critical_path(flat, {}) == 0.0


def _longest_by_sorter(deps: dict[str, list[str]], weight: dict[str, float]) -> float:
    """The longest chain as graphlib's order computes it: the reference for critical_path."""
    best: dict[str, float] = {}
    for name in graphlib.TopologicalSorter(deps).static_order():
        best[name] = weight.get(name, 0.0) + max((best[d] for d in deps.get(name, ())),
                                                 default=0.0)
    return max(best.values(), default=0.0)


def test_critical_path_agrees_with_a_topological_sort_on_random_graphs() -> None:
    rng = random.Random(36)
    for _ in range(200):
        names = [f"n{i}" for i in range(rng.randint(1, 30))]
        # edges only towards earlier names: acyclic; keys in a shuffled order
        deps = {n: rng.sample(names[:i], rng.randint(0, min(i, 4))) for i, n in enumerate(names)}
        deps = dict(rng.sample(sorted(deps.items()), len(deps)))
        weight = {n: rng.choice([0.0, 0.5, 1.25, 3.0]) for n in names if rng.random() < 0.8}
        assert dag.critical_path(deps, weight) == _longest_by_sorter(deps, weight)
    # a dependency that is no key of its own counts with its weight, as the sorter counts it
    assert dag.critical_path({"s": ["w"]}, {"s": 1.0, "w": 2.0}) == 3.0


def test_critical_path_of_a_fan_out_with_its_synthesizer() -> None:
    workers = [f"agent_{i}" for i in range(100)]
    deps = {**{w: [] for w in workers}, "synthesizer": list(workers)}
    weight = {w: 0.5 + i / 1000 for i, w in enumerate(workers)} | {"synthesizer": 0.501}
    assert dag.critical_path(deps, weight) == 0.599 + 0.501


def test_critical_path_refuses_a_cycle() -> None:
    with pytest.raises(graphlib.CycleError):
        dag.critical_path({"a": ["b"], "b": ["c"], "c": ["a"]}, {"a": 1.0})


def test_topological_order_without_edges_follows_the_given_order() -> None:
    deps: dict[str, list[str]] = {"c": [], "a": [], "x": [], "b": [], "y": []}
    # names the order does not list come last, in the graph's own order (as the sorter puts them)
    assert dag.topological_order(deps, ["a", "b", "c"]) == ["a", "b", "c", "x", "y"]
    assert dag.topological_order({}, ["a"]) == []
