"""docs/API.md is checked against the OpenAPI document the service serves: a section for every
route of the document and none for a route it lacks; each section names the route's query and
header parameters and every status the document lists for it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from app.main import create_app
from tests.conftest import make_settings

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "API.md"
SECTION = re.compile(r"^### (GET|POST|PUT|PATCH|DELETE) (/\S*)\s*$", re.M)


def sections(text: str) -> dict[tuple[str, str], str]:
    """(method, path) -> the section's text, up to the next heading."""
    found: dict[tuple[str, str], str] = {}
    matches = list(SECTION.finditer(text))
    for m in matches:
        rest = text[m.end():]
        end = re.search(r"^#{1,3} ", rest, re.M)
        key = (m.group(1).lower(), m.group(2))
        assert key not in found, f"two sections for {key}"
        found[key] = rest[: end.start() if end else len(rest)]
    return found


def test_the_guide_has_a_section_for_every_route_and_no_other(sqlite_url: str) -> None:
    doc = create_app(make_settings(sqlite_url)).openapi()
    routes = {(method, path): op for path, ops in doc["paths"].items()
              for method, op in ops.items()}
    guide = sections(GUIDE.read_text())
    assert sorted(set(routes) - set(guide)) == [], "routes the guide lacks"
    assert sorted(set(guide) - set(routes)) == [], "sections for routes the service lacks"
    for key, op in routes.items():
        text = guide[key]
        for param in op.get("parameters", []):
            if param["in"] != "path":
                assert f"`{param['name']}`" in text, (key, param["name"])
        for status in op["responses"]:
            assert re.search(rf"`{status}\b|\b{status}\b", text), (key, status)


def test_a_missing_section_is_found() -> None:
    text = "### GET /a\nx `200`\n### POST /b\ny\n## Other\n"
    assert set(sections(text)) == {("get", "/a"), ("post", "/b")}
    assert sections(text)[("post", "/b")] == "\ny\n"


def test_the_served_document_points_at_no_page_outside_the_repository(sqlite_url: str) -> None:
    """/docs and /redoc show these descriptions: the project's notes (SPEC, DESIGN) are not
    what their readers have."""
    doc = json.dumps(create_app(make_settings(sqlite_url)).openapi(), ensure_ascii=False)
    assert not re.findall(r".{60}\b(?:SPEC|DESIGN)\b.{20}", doc)
