"""The layering contract of `make lint` (import-linter): it holds, and it catches a wrong import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
