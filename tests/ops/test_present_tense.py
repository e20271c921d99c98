"""Code and docs speak in the present tense: no comment in app/ or swarm_api_client/ points at a
work log (numbered sessions, stops or rounds, bench runs, bench/RESULTS.md); the why of a
measured choice lives in docs/decisions/. docs/ARCHITECTURE.md is a map of at most 300 lines,
and every decision record says its context, its decision and its date."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("app", "swarm_api_client")
SUFFIXES = {".py", ".js", ".css", ".html"}
# numbered sessions, stops and rounds of work, and the logs that told them
NUMBERED = (r"\bsessions? \d+|\bstops? \d+|\bround (?:one|two|three|\d+)\b|\bwork ?logs?\b"
            r"|\bbench runs?\b|\bthis round\b|\bfirst round\b")
WORK_LOG = re.compile(r"RESULTS\.md|" + NUMBERED, re.IGNORECASE)  # in code: a comment says why
HISTORY = re.compile(NUMBERED, re.IGNORECASE)  # in docs, which may point at the current table
# Being split and cleaned in parallel; an entry is removed once its file is clean (the last test
# fails while a listed file has nothing left to allow).
ALLOWED: set[str] = set()
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
DECISIONS = ROOT / "docs" / "decisions"


def work_log_references(root: Path) -> list[str]:
    """`path:line: text` of every line under `root`'s source packages that cites a work log."""
    found = []
    for package in SOURCES:
        for path in sorted((root / package).rglob("*")):
            if path.suffix not in SUFFIXES or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root).as_posix()
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if WORK_LOG.search(line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    return found


def _file_of(reference: str) -> str:
    return reference.split(":", 1)[0]


def test_no_comment_cites_a_work_log() -> None:
    found = [r for r in work_log_references(ROOT) if _file_of(r) not in ALLOWED]
    assert not found, "say why in a line, or point to docs/decisions/:\n" + "\n".join(found)


def test_the_pattern_catches_what_it_is_for(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (tmp_path / "swarm_api_client").mkdir()
    (app / "a.py").write_text(
        "x = 1  # 4 ms faster (bench/RESULTS.md)\n"
        "y = 2  # measured in session 25\n"
        "z = 3  # since stop 39\n"
        "w = 4  # the speed of round two\n"
        "v = 5  # one round trip, a stop at the end, the session's pool\n")
    assert [r.split(":")[1] for r in work_log_references(tmp_path)] == ["1", "2", "3", "4"]


def test_every_allowed_file_still_needs_it() -> None:
    cited = {_file_of(r) for r in work_log_references(ROOT)}
    stale = sorted(p for p in ALLOWED if p not in cited)
    assert not stale, f"clean now: remove from ALLOWED: {stale}"


def test_the_architecture_is_a_short_map_in_the_present_tense() -> None:
    text = ARCHITECTURE.read_text()
    assert len(text.splitlines()) <= 300
    assert not HISTORY.search(text), HISTORY.search(text)
    for section in ("## Packages", "## One swarm, start to end",
                    "## The persistence path and its guarantees", "### a subtask status",
                    "### a per-attempt (ledger) field", "### a new write"):
        assert section in text, section


def test_every_decision_has_its_context_decision_and_date() -> None:
    records = sorted(DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert len(records) >= 2
    numbers = [int(p.name[:4]) for p in records]
    assert numbers == list(range(1, len(records) + 1)), "numbered 0001, 0002, … without gaps"
    for path in records:
        text = path.read_text()
        assert text.startswith("# "), path.name
        assert re.search(r"^Date: 20\d\d-\d\d-\d\d", text, re.M), f"{path.name}: no Date line"
        for section in ("## Context", "## Decision"):
            assert section in text, f"{path.name}: no {section}"
        assert "## Measurement" in text or "## Why" in text, f"{path.name}: no measurement"
        assert not HISTORY.search(text), f"{path.name}: {HISTORY.search(text)}"


def test_the_architecture_lists_every_decision() -> None:
    text = ARCHITECTURE.read_text()
    for path in DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md"):
        assert f"(decisions/{path.name})" in text, f"{path.name} is not listed"
