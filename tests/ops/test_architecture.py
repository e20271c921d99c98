"""The layering contract of `make lint` (import-linter): it holds, and it catches a wrong import;
test modules share helpers, never each other; no import cycle; no module of the service, the
client, the benchmarks or the tests is over 400 lines."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _copy_project(dest: Path) -> Path:
    shutil.copytree(ROOT / "app", dest / "app", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    # lint-imports puts its working directory first on sys.path, so the copy is what it reads
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_layers_hold_and_a_wrong_import_breaks_them(tmp_path: Path) -> None:
    clean = _copy_project(tmp_path / "clean")
    ok = _lint(clean)
    assert ok.returncode == 0, ok.stdout + ok.stderr

    wrong = _copy_project(tmp_path / "wrong")
    dag = wrong / "app" / "engine" / "dag.py"
    dag.write_text(dag.read_text() + "\nimport app.api.swarms  # the engine reaching up\n")
    broken = _lint(wrong)
    assert broken.returncode != 0
    assert "app.engine.dag -> app.api.swarms" in broken.stdout


@pytest.mark.parametrize(("module", "line", "says"), [
    ("app/views.py", "import app.api.ops  # a route module below the entry points",
     "only the entry points (main, cli) import the routes BROKEN"),
    ("app/engine/dag.py", "from app.db.driver import DirectConnection  # a dialect's own",
     "never a dialect's own module or driver BROKEN"),
    ("app/api/ops.py", "import asyncpg  # a driver in a route",
     "never a dialect's own module or driver BROKEN"),
    ("app/engine/calls.py", "import app.engine.run_state  # the runner's state, not the seam",
     "never the runner's parts BROKEN"),
    ("app/engine/run_state.py", "import app.engine.tolerance  # the state reaching a part above",
     "tolerance > run_state BROKEN"),
])
def test_the_seams_break_on_a_wrong_import(tmp_path: Path, module: str, line: str,
                                           says: str) -> None:
    wrong = _copy_project(tmp_path / "wrong")
    path = wrong / module
    path.write_text(path.read_text() + f"\n{line}\n")
    broken = _lint(wrong)
    assert broken.returncode != 0
    assert says in " ".join(broken.stdout.split())


def test_an_import_cycle_breaks_the_contract_even_under_type_checking(tmp_path: Path) -> None:
    wrong = _copy_project(tmp_path / "cycle")
    dag = wrong / "app" / "engine" / "dag.py"
    # planner imports dag; dag importing planner, even only for a type, closes a cycle (the
    # executor importing the runner for its type was one, removed by engine/owned_swarm.py)
    dag.write_text(dag.read_text() + "\nfrom typing import TYPE_CHECKING\n"
                   "if TYPE_CHECKING:\n    from app.engine import planner  # noqa\n")
    assert "from app.engine import dag" in (wrong / "app/engine/planner.py").read_text()
    broken = _lint(wrong)
    assert broken.returncode != 0
    assert "No cycles are allowed in app.engine" in broken.stdout


# ---- test modules share helpers, never each other ------------------------------------------


def _forbidden(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == "bench" or (parts[0] == "tests"
                                   and any(p.startswith("test_") for p in parts))


def forbidden_imports(source: str) -> list[str]:
    """What a test module imports from another test module or from bench/ (helpers belong in
    tests/helpers.py, tests/support.py, tests/procs.py and the like)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _forbidden(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from inside tests/
                base = f"tests.{base}" if base else "tests"
            if _forbidden(base):
                found.append(base)
            else:  # `from tests import test_x`
                found += [f"{base}.{a.name}" for a in node.names if _forbidden(f"{base}.{a.name}")]
    return found


def test_no_test_module_imports_another_or_bench() -> None:
    offenders = {str(p.relative_to(ROOT)): bad for p in sorted((ROOT / "tests").rglob("test_*.py"))
                 if (bad := forbidden_imports(p.read_text()))}
    assert offenders == {}


@pytest.mark.parametrize("source", [
    "from tests.test_engine import agent",
    "from tests import test_engine",
    "import tests.test_api_routes",
    "import tests.unit.test_dag as d",
    "from .test_engine import agent",
    "from . import test_engine",
    "from bench.bench_table import main",
    "import bench",
    "def f():\n    from tests.test_engine import ledger\n",
])
def test_the_import_check_catches_a_test_or_bench_import(source: str) -> None:
    assert forbidden_imports(source)


@pytest.mark.parametrize("source", [
    "from tests.helpers import agent",
    "from tests.conftest import Harness",
    "from tests import helpers",
    "import tests.procs",
    "from app.db import tables",
    "import benchmark_tools",
])
def test_the_import_check_lets_helpers_through(source: str) -> None:
    assert forbidden_imports(source) == []


# ---- no import cycle at all: function-level imports and package __init__s included -------

PACKAGES = ("app", "swarm_api_client")


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Every module of PACKAGES under `root`: its dotted name -> (file, is a package)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _imported(node: ast.AST, package: str, modules: dict[str, tuple[Path, bool]]) -> set[str]:
    """What an import statement imports: `import a.b` the module a.b; `from p import x` the
    package p (its __init__ runs and gives x) and p.x when x is a module."""
    out: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            target = alias.name
            while target and target not in modules:
                target = target.rpartition(".")[0]
            out |= {target} if target else set()
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the importer's package up
            anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        out |= {base} & modules.keys()
        out |= {f"{base}.{a.name}" for a in node.names} & modules.keys()
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules it imports anywhere in its text (in functions, under
    TYPE_CHECKING too), for the packages under `root`."""
    modules = _modules(root)
    graph = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            found |= _imported(node, package, modules)
        graph[name] = found - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_no_import_cycle_in_the_packages() -> None:
    assert import_cycles(import_graph(ROOT)) == []


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(("files", "cycle"), [
    ({"app/__init__.py": "", "app/a.py": "import app.b\n",
      "app/b.py": "def f():\n    from app import a\n"}, ["app.a", "app.b"]),
    ({"app/__init__.py": "", "app/sim/__init__.py": "from app.sim.x import X\n",
      "app/sim/x.py": "from app.sim import y\nX = 1\n", "app/sim/y.py": "Y = 1\n"},
     ["app.sim", "app.sim.x"]),
    ({"app/__init__.py": "", "app/p/__init__.py": "from .q import Q\n",
      "app/p/q.py": "from . import r\nQ = 1\n", "app/p/r.py": "from typing import TYPE_CHECKING\n"
      "if TYPE_CHECKING:\n    from app.p.q import Q\n"}, ["app.p", "app.p.q", "app.p.r"]),
])
def test_the_cycle_check_finds_a_cycle(tmp_path: Path, files: dict[str, str],
                                       cycle: list[str]) -> None:
    assert import_cycles(import_graph(_package(tmp_path, files))) == [cycle]


def test_the_cycle_check_lets_a_package_reexport_its_modules(tmp_path: Path) -> None:
    root = _package(tmp_path, {"app/__init__.py": "", "app/sim/__init__.py": "from .x import X\n",
                               "app/sim/x.py": "import app.sim.y as y\nX = y.Y\n",
                               "app/sim/y.py": "Y = 1\n"})
    assert import_cycles(import_graph(root)) == []


MAX_MODULE_LINES = 400
SIZED_PACKAGES = ("app", "swarm_api_client", "bench", "tests")


def oversized_modules(root: Path, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """The modules of app/, swarm_api_client/, bench/ and tests/ under `root` longer than
    `limit` lines."""
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines())
             for package in SIZED_PACKAGES for p in (root / package).rglob("*.py")}
    return {path: n for path, n in sorted(sizes.items()) if n > limit}


def test_no_module_of_the_project_is_over_400_lines() -> None:
    assert oversized_modules(ROOT) == {}, "split it by concern, each module named for what it holds"


def test_the_size_check_catches_a_long_module(tmp_path: Path) -> None:
    for package in SIZED_PACKAGES:
        (tmp_path / package / "inner").mkdir(parents=True)
        (tmp_path / package / "inner" / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "swarm_api_client" / "inner" / "long.py").write_text(
        "x = 1\n" * (MAX_MODULE_LINES + 1))
    assert oversized_modules(tmp_path) == {"swarm_api_client/inner/long.py": MAX_MODULE_LINES + 1}
