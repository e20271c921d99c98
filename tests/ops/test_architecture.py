"""The layering contract of `make lint` (import-linter): it holds, and it catches a wrong import;
no module of the service or the client is over 400 lines."""

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


def test_an_import_cycle_breaks_the_contract_even_under_type_checking(tmp_path: Path) -> None:
    wrong = _copy_project(tmp_path / "cycle")
    dag = wrong / "app" / "engine" / "dag.py"
    # planner imports dag; dag importing planner, even only for a type, closes a cycle (the
    # executor importing the runner for its type was one, removed by engine/handle.py)
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


MAX_MODULE_LINES = 400


def oversized_modules(root: Path, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """The modules of app/ and swarm_api_client/ under `root` longer than `limit` lines."""
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines())
             for package in ("app", "swarm_api_client") for p in (root / package).rglob("*.py")}
    return {path: n for path, n in sorted(sizes.items()) if n > limit}


def test_no_module_of_the_service_or_the_client_is_over_400_lines() -> None:
    assert oversized_modules(ROOT) == {}, "split it by concern, each module named for what it holds"


def test_the_size_check_catches_a_long_module(tmp_path: Path) -> None:
    for package in ("app", "swarm_api_client"):
        (tmp_path / package / "inner").mkdir(parents=True)
        (tmp_path / package / "inner" / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "swarm_api_client" / "inner" / "long.py").write_text(
        "x = 1\n" * (MAX_MODULE_LINES + 1))
    assert oversized_modules(tmp_path) == {"swarm_api_client/inner/long.py": MAX_MODULE_LINES + 1}
