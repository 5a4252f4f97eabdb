"""``/docs`` and ``/redoc``: the interactive API pages, from files the service serves itself.

FastAPI's own pages load Swagger UI's and ReDoc's scripts and styles from a CDN, so they are
blank on a machine without internet access (and tell a third party who reads the docs). The
``fastapi-offline`` package ships those files (Swagger UI 5, which reads the OpenAPI 3.1 schema
FastAPI writes; the ``swagger-ui-bundle`` package's Swagger UI 4 cannot); they are served under
``/docs/assets`` and the pages name only them. Only its files are used, not its app class.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_URL, REDOC_URL = "/docs", "/redoc"
ASSETS_URL = f"{DOCS_URL}/assets"
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"


def add_docs_pages(app: FastAPI) -> None:
    """Serve ``/docs`` and ``/redoc`` with local assets (the app is created with
    ``docs_url=None, redoc_url=None``)."""
    app.mount(ASSETS_URL, StaticFiles(directory=str(ASSETS_DIR)), name="api-docs-assets")
    openapi_url, favicon = app.openapi_url or "/openapi.json", f"{ASSETS_URL}/favicon.png"

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_page() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url, title=f"{app.title} - API", swagger_favicon_url=favicon,
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js", swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            # Swagger UI would otherwise send the schema to an online validator.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc_page() -> HTMLResponse:
        # without Google Fonts: ReDoc falls back to the browser's own fonts
        return get_redoc_html(openapi_url=openapi_url, title=f"{app.title} - API",
                              redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js", redoc_favicon_url=favicon,
                              with_google_fonts=False)
