"""Statuses are spelled in app/states.py only (STYLE: one state machine): no status literal
elsewhere in app/, and no status moved but through its transition."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
