"""The layering contract of `make lint` (import-linter): it holds, and it catches a wrong import;
no module of the service, the client or the benchmarks is over 400 lines."""

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


# ---- statuses are spelled in app/states.py only ------------------------------------------
#
# A string constant whose whole value is a status or outcome of app/states.py (a swarm's, a
# subtask's, a webhook delivery's, a gateway attempt's, a tool call's) is a status literal
# when it is used as one:
#   - an operand of a comparison (==, !=, in, not in, is), or an item of a tuple, list or set
#     that is one;
#   - the value given to a name, attribute, keyword argument or dict key called `status`,
#     `state` or `outcome` (or ending `_status`, `_state`, `_outcome`), unpacking included,
#     or to a constant named after it (`IN_FLIGHT = "in_flight"`);
#   - an item of a tuple, list or set holding two or more status values (a status list);
#   - SQL: a quoted SQL literal (`'running'`) anywhere inside a string or an f-string.
# Anything else is text, not a status: docstrings, log and error messages, dict keys
# (`{"ok": 0}`), defaults of unrelated lookups (`.get("code", "unknown")`), positional
# arguments. app/states.py is the one place that spells them; SQL takes them from there
# (`states.sql_in`, or an f-string of the enum member). Two other vocabularies share a word
# and are left out: the health body's `"status": "ok"` (SPEC §3) and the simulator, a gateway
# of its own whose fault names (`"timeout"`) are no status of this service.

_STATUS_NAMES = ("status", "state", "outcome")


def _status_words() -> frozenset[str]:
    from app import states

    enums = (states.SwarmStatus, states.SubtaskStatus, states.WebhookState,
             states.AttemptOutcome, states.ToolCallStatus)
    return frozenset(m.value for e in enums for m in e)


def _named_status(target: ast.expr | str | None) -> bool:
    if isinstance(target, ast.Name):
        target = target.id
    elif isinstance(target, ast.Attribute):
        target = target.attr
    elif isinstance(target, ast.Constant) and isinstance(target.value, str):
        target = target.value
    if not isinstance(target, str):
        return False
    name = target.lower().lstrip("_")
    return name in _STATUS_NAMES or name.endswith(tuple(f"_{n}" for n in _STATUS_NAMES))


class _StatusLiterals(ast.NodeVisitor):
    """Collects (line, value) of the status literals of one module, by the rules above."""

    def __init__(self) -> None:
        self.words = _status_words()
        self.quoted = [f"'{w}'" for w in self.words]
        self.found: set[tuple[int, str]] = set()

    def word(self, node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value if node.value in self.words else None
        return None

    @staticmethod
    def items(node: ast.AST | None) -> list[ast.expr]:
        return list(node.elts) if isinstance(node, ast.Tuple | ast.List | ast.Set) else []

    def flag(self, node: ast.expr | None) -> None:
        for n in [node, *self.items(node)] if node is not None else []:
            if (w := self.word(n)) is not None:
                self.found.add((n.lineno, w))

    def given(self, target: ast.expr | str | None, value: ast.expr | None) -> None:
        if isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List):
            for t, v in zip(target.elts, value.elts, strict=False):
                self.given(t, v)
        elif _named_status(target) or (isinstance(target, ast.Name)
                                        and target.id.lower().lstrip("_") == self.word(value)):
            self.flag(value)  # a status's field, or a constant named after it (IN_FLIGHT)

    def generic_visit(self, node: ast.AST) -> None:
        if len([e for e in self.items(node) if self.word(e) is not None]) >= 2:
            self.flag(node)  # type: ignore[arg-type]
        super().generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        for operand in (node.left, *node.comparators):
            self.flag(operand)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self.given(target, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.given(node.target, node.value)
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        self.given(node.arg, node.value)
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        for key, value in zip(node.keys, node.values, strict=True):
            self.given(key, value)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):  # SQL: a quoted literal inside any string
            self.found.update((node.lineno, q.strip("'")) for q in self.quoted
                              if q in node.value)


def status_literals(source: str) -> list[tuple[int, str]]:
    """(line, value) of each status literal in `source`, by the rules above."""
    visitor = _StatusLiterals()
    visitor.visit(ast.parse(source))
    return sorted(visitor.found)


_NOT_STATUSES = {("app/api/ops.py", "ok")}  # the health body's status


def test_no_status_literal_outside_states() -> None:
    files = [p for p in sorted((ROOT / "app").rglob("*.py"))
             if p != ROOT / "app" / "states.py" and "simulator" not in p.parts]
    offenders = [f"{p.relative_to(ROOT)}:{line}: {value!r}" for p in files
                 for line, value in status_literals(p.read_text())
                 if (str(p.relative_to(ROOT)), value) not in _NOT_STATUSES]
    assert offenders == [], "\n".join(offenders)


@pytest.mark.parametrize("source", [
    "if sub.status == 'running': pass",
    "ok = outcome in ('ok', 'unknown')",
    "row = {'outcome': 'in_flight'}",
    "stmt.values(outcome='unknown')",
    "self._outcome = 'timeout'",
    "outcome, error = 'invalid_response', 'undecodable body'",
    "status: str = 'failed'",
    "IN_FLIGHT = 'in_flight'",
    "OUTCOMES = ('ok', 'rate_limited')",
    "q = text(\"SELECT 1 FROM swarms WHERE status IN ('queued', 'running')\")",
    "q = f\"UPDATE t SET x = 1 WHERE {t}.outcome = 'in_flight'\"",
])
def test_the_status_check_catches_a_literal(source: str) -> None:
    assert status_literals(source)


@pytest.mark.parametrize("source", [
    "log.error('the call failed: %s', exc)",
    "raise ValueError('cancelled')",
    "counts = {'ok': 0, 'calls': 0}",
    "code = err.get('code', 'unknown')",
    "status = SubtaskStatus.running",
    "if outcome is AttemptOutcome.ok: pass",
    "q = text(f\"SELECT 1 WHERE status IN ({sql_in(CLAIMABLE_SWARM)})\")",
    "'''A subtask `running` goes back to pending.'''",
    "metric.labels(model, 'ok')",
])
def test_the_status_check_lets_text_through(source: str) -> None:
    assert status_literals(source) == []


def status_moves(source: str) -> list[int]:
    """Lines that write a `.status` attribute: a move that bypasses app/states.py's moves (a
    row's first status is given where it is made, as a constructor's keyword)."""
    def targets(node: ast.expr) -> list[ast.expr]:
        return [t for e in node.elts for t in targets(e)] if isinstance(
            node, ast.Tuple | ast.List) else [node]

    return sorted(
        node.lineno for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
        and any(isinstance(t, ast.Attribute) and t.attr == "status"
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                for t in targets(target)))


def test_no_status_is_moved_outside_states() -> None:
    offenders = [f"{p.relative_to(ROOT)}:{line}" for p in sorted((ROOT / "app").rglob("*.py"))
                 if p != ROOT / "app" / "states.py" for line in status_moves(p.read_text())]
    assert offenders == []


@pytest.mark.parametrize("source", [
    "sub.status = SubtaskStatus.running",
    "sub.status, sub.output = SubtaskStatus.running, None",
    "self.swarm.status: SwarmStatus = status",
])
def test_the_move_check_catches_a_status_write(source: str) -> None:
    assert status_moves(source) == [1]


def test_the_move_check_lets_reads_and_creations_through() -> None:
    assert status_moves("s = Swarm(status=SwarmStatus.queued)\nx = r.status\n"
                        "if sub.status is T.running: pass\nstatus = sub.status\n") == []


# ---- no dialect test outside app/db: the rest asks app.db.dialect what, never which -------

DIALECT_NAMES = frozenset({"is_sqlite", "is_postgres", "postgres_engine", "POSTGRESQL", "SQLITE"})
DIALECT_PREFIXES = ("sqlite", "postgres")
# (file, function): where naming a dialect is no test of it
DIALECT_ALLOWED = {
    # SWARM_DATABASE_URL's parse (SPEC §2) names the two drivers; config sits below app.db
    ("app/config.py", "database_url_of"),
}


def _names_dialect(node: ast.AST) -> bool:
    values = node.elts if isinstance(node, ast.Tuple) else [node]
    return any(isinstance(v, ast.Constant) and isinstance(v.value, str)
               and v.value.lower().startswith(DIALECT_PREFIXES) for v in values)


def _dialect_name(node: ast.Attribute) -> bool:
    """`<x>.dialect.name`, `dialect.name`, `dialect_of(...).name`."""
    value = node.value
    return node.attr == "name" and (
        (isinstance(value, ast.Attribute) and value.attr == "dialect")
        or (isinstance(value, ast.Name) and value.id == "dialect")
        or (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id == "dialect_of"))


def _dialect_test(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name) and node.id in DIALECT_NAMES:
        return node.id
    if isinstance(node, ast.Attribute) and (node.attr in DIALECT_NAMES or _dialect_name(node)):
        return ast.unparse(node)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in DIALECT_NAMES:
        return f"def {node.name}"
    if isinstance(node, ast.Import) and any(a.name.startswith("sqlalchemy.dialects")
                                            for a in node.names):
        return ast.unparse(node)
    if isinstance(node, ast.ImportFrom) and (
            (node.module or "").startswith("sqlalchemy.dialects")
            or any(a.name in DIALECT_NAMES for a in node.names)):
        return ast.unparse(node)
    if isinstance(node, ast.Compare) and any(
            _names_dialect(o) for o in (node.left, *node.comparators)):
        return ast.unparse(node)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
            and any(_names_dialect(a) for a in node.args)):
        return ast.unparse(node)
    return None


def dialect_tests(source: str, allowed: frozenset[str] = frozenset()) -> list[str]:
    """The places `source` asks which database it runs on (the functions named in `allowed`
    left out)."""
    found: list[str] = []
    for top in ast.parse(source).body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) and top.name in allowed:
            continue
        found += [hit for node in ast.walk(top) if (hit := _dialect_test(node))]
    return found


def test_no_dialect_test_outside_the_database_layer() -> None:
    offenders = {}
    for package in ("app", "swarm_api_client"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel.startswith("app/db/"):
                continue
            allowed = frozenset(f for r, f in DIALECT_ALLOWED if r == rel)
            if found := dialect_tests(path.read_text(), allowed):
                offenders[rel] = found
    assert offenders == {}


@pytest.mark.parametrize("source", [
    "if settings.is_sqlite:\n    pass\n",
    "from app.db.session import is_postgres\n",
    "engine = postgres_engine(sessions)\n",
    "pg = session.get_bind().dialect.name == 'postgresql'\n",
    "pg = dialect_of(url).name\n",
    "if dialect_of(url) is POSTGRESQL:\n    pass\n",
    "lite = url.startswith('sqlite')\n",
    "lite = url.startswith(('sqlite', 'x'))\n",
    "lite = 'postgresql+asyncpg' in url\n",
    "from sqlalchemy.dialects.postgresql import insert\n",
    "import sqlalchemy.dialects.sqlite\n",
    "def f(u):\n    def is_sqlite():\n        return u == 'sqlite+aiosqlite:///x'\n",
])
def test_the_dialect_check_catches_a_test(source: str) -> None:
    assert dialect_tests(source)


@pytest.mark.parametrize("source", [
    "if dialect_of(settings.database_url).listens_for_changes:\n    pass\n",
    "from app.db.dialect import dialect_of, engine_of\n",
    "name = swarm.name\n",
    "DRIVERS = {'sqlite': 'sqlite+aiosqlite'}\n",
    "def database_url_of(raw):\n    return raw == 'sqlite'\n",
])
def test_the_dialect_check_lets_capabilities_through(source: str) -> None:
    assert dialect_tests(source, frozenset({"database_url_of"})) == []


def test_routes_run_no_sql() -> None:
    """Routes ask app/db's functions; of SQLAlchemy they name only sessions and its errors."""
    offenders = {}
    for path in sorted((ROOT / "app" / "api").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if bad := [n for n in names if n.split(".")[0] == "sqlalchemy"
                       and n not in ("sqlalchemy.ext.asyncio", "sqlalchemy.exc")]:
                offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


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
SIZED_PACKAGES = ("app", "swarm_api_client", "bench")


def oversized_modules(root: Path, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """The modules of app/, swarm_api_client/ and bench/ under `root` longer than `limit`
    lines."""
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines())
             for package in SIZED_PACKAGES for p in (root / package).rglob("*.py")}
    return {path: n for path, n in sorted(sizes.items()) if n > limit}


def test_no_module_of_the_service_the_client_or_the_benchmarks_is_over_400_lines() -> None:
    assert oversized_modules(ROOT) == {}, "split it by concern, each module named for what it holds"


def test_the_size_check_catches_a_long_module(tmp_path: Path) -> None:
    for package in SIZED_PACKAGES:
        (tmp_path / package / "inner").mkdir(parents=True)
        (tmp_path / package / "inner" / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "swarm_api_client" / "inner" / "long.py").write_text(
        "x = 1\n" * (MAX_MODULE_LINES + 1))
    assert oversized_modules(tmp_path) == {"swarm_api_client/inner/long.py": MAX_MODULE_LINES + 1}
