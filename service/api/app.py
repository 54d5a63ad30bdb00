"""The FastAPI application: routers, settings on app.state, OpenAPI docs at /docs."""

from __future__ import annotations

from fastapi import Depends, FastAPI

from service.api import console, observe
from service.api.deps import get_current_user
from service.api.docs import mount_docs
from service.api.errors import install_error_handlers
from service.api.routes import advice, health, jobs, prometheus, runtime, teams, users
from service.logs import configure_logging
from service.metrics import install_transition_metrics
from service.settings import Settings, get_settings


def create_app(settings: Settings | None = None) -> FastAPI:
    app = FastAPI(
        title="zeropilot",
        version="0.1.0",
        description="Run DeepSpeed training jobs on shared GPU clusters.",
        docs_url=None,  # served by mount_docs, without a CDN
        redoc_url=None,
    )
    mount_docs(app)
    install_error_handlers(app)
    app.state.settings = settings = settings or get_settings()
    for module in (health, jobs, runtime, teams, users, prometheus):
        app.include_router(module.router)
    configure_logging(settings.log.format, settings.log.level)
    install_transition_metrics()
    observe.install(app)
    console.mount(app)
    # Advice is pure computation, but still only for known users, on the configured clusters.
    app.include_router(advice.router, dependencies=[Depends(get_current_user)])
    app.dependency_overrides[advice.cluster_profiles] = settings.cluster_profiles
    return app
