"""The web console: a static page served by the API itself, over the same /v1 API and tokens.

Nothing to build or install for a user, and nothing fetched from elsewhere at run time (clusters
are often offline): the HTML, script, style and charts (hand-drawn SVG) are files in this
package. The page keeps the bearer token in the browser's session (or local) storage and sends
it in the Authorization header only, never in a URL.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from service.api.console import calibration, data, timeline

STATIC = Path(__file__).parent / "static"
# The page holds a bearer token: only this server's own scripts may run, and nothing may frame it.
POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def mount(app: FastAPI) -> None:
    app.include_router(data.router)
    app.include_router(timeline.router)
    app.include_router(calibration.router)
    app.mount("/console/static", StaticFiles(directory=STATIC), name="console-static")
    app.add_api_route("/console", _page, include_in_schema=False)
    app.add_api_route("/", _to_console, include_in_schema=False)


def _page() -> FileResponse:
    headers = {"Cache-Control": "no-cache", "Content-Security-Policy": POLICY}
    return FileResponse(STATIC / "index.html", headers=headers)


def _to_console() -> RedirectResponse:
    return RedirectResponse("/console")
