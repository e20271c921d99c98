"""The docs point only at what the repository holds: every relative link of README.md and
docs/ resolves to a file (and its #anchor to a heading of it), every repository path written
in code (`app/config.py`) exists, and nothing points at the project's notes outside the
repository (its SPEC, DESIGN or STYLE pages, /work/ paths)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# a path written in code: dirs/name.ext, or a top-level file of the repository
CODE_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|json|toml|yml|yaml|txt|ini|cfg))`")
OUTSIDE = re.compile(r"\bSPEC\b|\bDESIGN\b|\bSTYLE\.md\b|/work/")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve_inside_the_repository(doc: Path) -> None:
    text = without_code_blocks(doc.read_text())
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: outside by design
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        assert path.is_file() and ROOT in path.parents, f"{doc.name}: {target} is not a file"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{doc.name}: no heading #{anchor} in {path.name}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_in_code_exist(doc: Path) -> None:
    for written in CODE_PATH.findall(doc.read_text()):
        candidates = [ROOT / written, doc.parent / written, ROOT / "app" / written]
        assert any(p.exists() for p in candidates), f"{doc.name}: `{written}` does not exist"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(doc: Path) -> None:
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        assert not OUTSIDE.search(line), f"{doc.name}:{n}: {line.strip()}"


def test_slugs_are_githubs() -> None:
    assert slug("Traces (OpenTelemetry)") == "traces-opentelemetry"
    assert slug("The first five minutes") == "the-first-five-minutes"
    assert slug("Shutdown, crashes, outages") == "shutdown-crashes-outages"
