"""The browser UI (SPEC §13): /ui lists recent swarms, /ui/swarms/{id} draws one live.

The pages are static files; their scripts read everything through the public API (`/swarms`,
its event stream, `/swarms/{id}/subtasks/{name}`) with the caller's key, so they hold no data
and need no auth of their own. A Content-Security-Policy keeps the browser to this host.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
STATIC_URL = "/ui/static"

# no inline script or style, nothing from another host, never framed
UI_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
          "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
          "form-action 'self'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": UI_CSP, "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}

router = APIRouter(prefix="/ui", include_in_schema=False)


def _page(name: str) -> FileResponse:
    return FileResponse(STATIC_DIR / name, media_type="text/html", headers=_HEADERS)


@router.get("")
async def show_swarm_list() -> FileResponse:
    """Recent swarms: status, progress, cost, age; filtered by status, paged."""
    return _page("index.html")


@router.get("/swarms/{swarm_id}")
async def show_swarm(swarm_id: str) -> FileResponse:
    """One swarm's DAG, live; the page reads the id from its own URL."""
    return _page("swarm.html")


def install(app: FastAPI) -> None:
    """The pages and their assets (scripts, styles, icon), all served by the app."""
    app.include_router(router)
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="ui-static")
