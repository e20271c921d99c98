"""The database seam: no dialect test outside app/db (the rest asks app.db.dialect what, never
which), and routes run no SQL."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
