"""OpenAPI docs served from the package: GPU clusters are often offline, so no CDN at run time.

The Swagger UI files under ``static/swagger-ui`` are swagger-ui-dist 5.35.0 from the npm registry
(Apache-2.0; its LICENSE and NOTICE lie beside them), without the source-map comments.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

SWAGGER_UI = Path(__file__).parent / "static" / "swagger-ui"
ASSETS = "/docs-assets"


def mount_docs(app: FastAPI) -> None:
    """``/docs`` with Swagger UI's script and style from this server (the app has docs_url=None)."""
    app.mount(ASSETS, StaticFiles(directory=SWAGGER_UI), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )
