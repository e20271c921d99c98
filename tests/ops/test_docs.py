"""/docs and /redoc work offline, operation ids read as verbs, and no page the service serves
to people loads anything from another host."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from fastapi import APIRouter
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from app.main import create_app
from app.ui.docs import offline_fastapi
from app.ui.routes import STATIC_DIR
from tests.browser import (
    LiveServer,
    driver,
    outside,
    requests_made,
    screenshot,
    severe_console,
    wait_for,
)
from tests.conftest import make_settings

__all__ = ["driver"]  # module-scoped fixtures: one browser for this file

SPEC_IDS = {
    ("post", "/swarms"): "create_swarm",
    ("get", "/swarms"): "list_swarms",
    ("get", "/swarms/{swarm_id}"): "get_swarm",
    ("post", "/swarms/{swarm_id}/cancel"): "cancel_swarm",
    ("get", "/swarms/{swarm_id}/events"): "stream_swarm_events",
    ("get", "/usage"): "get_usage",
    ("get", "/healthz"): "check_health",
    ("get", "/readyz"): "check_ready",
    ("get", "/metrics"): "get_metrics",
}
VERBS = {"create", "get", "list", "cancel", "stream", "retry", "check", "delete", "update",
         "call", "run", "submit", "complete", "read", "watch", "replace", "set", "search",
         "estimate", "approve", "reject", "erase"}
PAGES = ["/docs", "/redoc", "/ui", f"/ui/swarms/{uuid.uuid4()}"]
# XML namespaces name a vocabulary; nothing is ever fetched from them
NAMESPACES = re.compile(r"http://www\.w3\.org/(2000/svg|1999/xhtml|1999/xlink)")
URL_IN_CSS = re.compile(r"""url\(\s*['"]?([^'")]+)|@import\s+['"]([^'"]+)""")


def test_operation_ids_read_as_verbs(sqlite_url: str) -> None:
    doc = create_app(make_settings(sqlite_url)).openapi()
    ids = {(method, path): op["operationId"]
           for path, ops in doc["paths"].items() for method, op in ops.items()}
    assert {k: ids.get(k) for k in SPEC_IDS} == SPEC_IDS
    assert len(set(ids.values())) == len(ids), "operation ids must be unique"
    for (method, path), op_id in ids.items():
        # snake_case from function names, or camelCase where a route mirrors another API's
        # ids (the OpenAI facade's createChatCompletion)
        words = re.fullmatch(r"[a-z]+(_[a-z0-9]+)*|[a-z]+([A-Z][a-z0-9]*)*", op_id)
        assert words, (method, path, op_id)
        assert re.split(r"_|(?=[A-Z])", op_id)[0] in VERBS, f"{op_id} ({method} {path})"
        assert not op_id.lower().endswith(f"_{method}"), f"{op_id} carries the HTTP method"


def test_two_routes_with_one_name_fail_to_document() -> None:
    router = APIRouter()

    @router.get("/a")
    async def get_thing() -> None: ...

    @router.get("/b", name="get_thing")
    async def get_other_thing() -> None: ...

    app = offline_fastapi()
    app.include_router(router)
    with pytest.raises(ValueError, match="operation id 'get_thing' of GET /b is already used"):
        app.openapi()


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.inline: list[str] = []
        self._in_style_or_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href", "action", "data", "poster")
                      and v is not None]
        self.inline += [v for k, v in attrs if k == "style" and v]
        self._in_style_or_script = tag in ("style", "script")

    def handle_data(self, data: str) -> None:
        if self._in_style_or_script:
            self.inline.append(data)


def _outside_hosts(text: str) -> list[str]:
    return [m for m in re.findall(r"(?:https?|wss?)://[^\s'\"`)<>]+", NAMESPACES.sub("", text))]


async def test_pages_load_nothing_from_another_host(sqlite_url: str) -> None:
    """Every page, every asset it names and every URL in its styles is the service's own; the
    UI's own scripts and styles name no other host; a CSP keeps the browser to the service."""
    app = create_app(make_settings(sqlite_url))
    base = "http://testserver"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base) as c:
        for page in PAGES:
            r = await c.get(page)
            assert r.status_code == 200, (page, r.status_code)
            csp = r.headers["content-security-policy"]
            assert "default-src 'self'" in csp and not _outside_hosts(csp), csp
            refs = _Refs()
            refs.feed(r.text)
            assert refs.urls, page
            assert _outside_hosts(" ".join(refs.inline)) == [], page
            for ref in refs.urls:
                url = urljoin(base + page, ref)
                assert urlsplit(url).netloc == "testserver", (page, ref)
                asset = await c.get(url)
                assert asset.status_code == 200, (page, ref, asset.status_code)
                if url.endswith(".css"):
                    for found in URL_IN_CSS.findall(asset.text):
                        target = found[0] or found[1]
                        assert target.startswith("data:") or urlsplit(
                            urljoin(url, target)).netloc == "testserver", (url, target)
        # every file of the UI (modules import each other) is served and names no host at all
        for path in sorted(STATIC_DIR.iterdir()):
            asset = await c.get(f"/ui/static/{path.name}")
            assert asset.status_code == 200, path.name
            assert _outside_hosts(asset.text) == [], path.name


# ---- in a real browser with every outside host blocked -----------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    db = tmp_path_factory.mktemp("docs") / "swarm.db"
    with LiveServer(make_settings(f"sqlite+aiosqlite:///{db}", engine=False)) as live:
        yield live


def test_docs_render_every_operation_offline(driver: WebDriver, server: LiveServer) -> None:
    ops = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    count = sum(len(v) for v in ops.values())
    requests_made(driver)
    driver.get(f"{server.url}/docs")
    wait_for(driver, f"document.querySelectorAll('.opblock').length === {count}")
    # anchors carry the verb ids, and the request example is shown
    driver.find_element(By.CSS_SELECTOR, "#operations-swarms-create_swarm .opblock-summary"
                        ).click()
    wait_for(driver, "document.querySelector('#operations-swarms-create_swarm')"
                     ".innerText.includes('PAY-1234')")
    screenshot(driver, "docs")
    made = requests_made(driver)
    assert any(r["url"].endswith("/openapi.json") for r in made)
    assert outside(made, server.url) == []
    assert severe_console(driver) == []


def test_redoc_renders_offline(driver: WebDriver, server: LiveServer) -> None:
    requests_made(driver)
    driver.get(f"{server.url}/redoc")
    wait_for(driver, "document.body.innerText.includes('Start a swarm')"
                     " && document.body.innerText.includes('PAY-1234')")
    screenshot(driver, "redoc")
    # ReDoc's sidebar asks for its vendor's logo; the page's CSP stops it in the browser
    for r in outside(requests_made(driver), server.url):
        assert r["blocked"] == "csp", r
