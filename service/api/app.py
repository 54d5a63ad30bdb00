"""The FastAPI application: routers, settings on app.state, OpenAPI docs at /docs."""

from __future__ import annotations

from fastapi import FastAPI

from service.api.routes import health, jobs, runtime, users
from service.settings import Settings, get_settings


def create_app(settings: Settings | None = None) -> FastAPI:
    app = FastAPI(
        title="zeropilot",
        version="0.1.0",
        description="Run DeepSpeed training jobs on shared GPU clusters.",
    )
    app.state.settings = settings or get_settings()
    for module in (health, jobs, runtime, users):
        app.include_router(module.router)
    return app
