"""/docs and /redoc that work without internet access, and operation ids that read as verbs.

FastAPI's default pages load Swagger UI and ReDoc from a CDN (a blank page behind a firewall);
fastapi-offline ships those bundles and the app serves them. The pages carry a
Content-Security-Policy that lets the browser load nothing from another host: ReDoc's sidebar
would otherwise fetch its vendor's logo from the internet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline

DOCS_STATIC_URL = "/static-offline-docs"

# Swagger UI's page starts it with an inline script; every URL it may load is the service's own
DOCS_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; "
            "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; "
            "worker-src 'self' blob:; connect-src 'self'; base-uri 'self'; frame-ancestors 'none'")

# show the ids (generated clients call them), keep a typed token across reloads, and never
# send the document to the public validator service
SWAGGER_UI_PARAMETERS: dict[str, Any] = {
    "displayOperationId": True,
    "persistAuthorization": True,
    "validatorUrl": None,
}

router = APIRouter(include_in_schema=False)


def operation_ids() -> Callable[[APIRoute], str]:
    """An app's `generate_unique_id_function`: a route's id is its function's name
    (`create_swarm`, not `create_swarm_swarms_post`). Two documented routes with one name
    would make generated clients and the docs' anchors ambiguous: building the OpenAPI
    document fails then (FastAPI names included routes lazily, so not at include time)."""
    seen: dict[str, str] = {}

    def operation_id(route: APIRoute) -> str:
        if route.include_in_schema:
            where = f"{','.join(sorted(route.methods or ()))} {route.path}"
            first = seen.setdefault(route.name, where)
            if first != where:
                raise ValueError(
                    f"operation id {route.name!r} of {where} is already used by {first}: "
                    "rename the route function or pass operation_id=")
        return route.name

    return operation_id


def _page(html: HTMLResponse) -> HTMLResponse:
    html.headers["Content-Security-Policy"] = DOCS_CSP
    html.headers["Cache-Control"] = "no-cache"
    return html


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return _page(get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{root}{DOCS_STATIC_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{DOCS_STATIC_URL}/swagger-ui.css",
        swagger_favicon_url=f"{root}{DOCS_STATIC_URL}/favicon.png",
        swagger_ui_parameters=SWAGGER_UI_PARAMETERS))


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return _page(get_redoc_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{root}{DOCS_STATIC_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{DOCS_STATIC_URL}/favicon.png",
        with_google_fonts=False))


def offline_fastapi(**kwargs: Any) -> FastAPI:
    """A FastAPI app with verb operation ids whose /docs and /redoc load only what the app
    itself serves (fastapi-offline mounts the bundles at DOCS_STATIC_URL)."""
    app = FastAPIOffline(docs_url=None, redoc_url=None, static_url=DOCS_STATIC_URL,
                         generate_unique_id_function=operation_ids(), **kwargs)
    app.include_router(router)
    return app
