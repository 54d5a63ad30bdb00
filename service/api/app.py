"""The FastAPI application: routers, settings on app.state, OpenAPI docs at /docs."""

from __future__ import annotations

from fastapi import Depends, FastAPI

from service.api import console, observe
from service.api.body_limit import BodyLimit
from service.api.deadline import Deadline
from service.api.deps import get_current_user
from service.api.docs import mount_docs
from service.api.errors import error_responses, install_error_handlers
from service.api.job_progress import ProgressHub, read_from
from service.api.plain_submit import plain_submit_route
from service.api.routes import (
    advice,
    calibration,
    health,
    job_outputs,
    jobs,
    prometheus,
    runtime,
    teams,
    users,
)
from service.api.text_guard import TextGuard
from service.logs import configure_logging
from service.metrics import install_transition_metrics
from service.settings import Settings, get_settings

# Any /v1 route may meet an unreadable or oversized body, a lost database or the deadline.
V1_ERRORS = error_responses(400, 413, 503, 504)


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
    app.include_router(health.router, responses=error_responses(504))
    app.include_router(prometheus.router)
    # Before the jobs router: well-formed submits skip FastAPI's per-request work.
    app.router.routes.append(plain_submit_route(jobs.create_job_route()))
    for module in (jobs, job_outputs, runtime, teams, users, calibration):
        app.include_router(module.router, responses=V1_ERRORS)
    configure_logging(settings.log.format, settings.log.level)
    install_transition_metrics()
    observe.install(app)
    console.mount(app)
    # Advice is pure computation, but still only for known users, on the configured clusters.
    app.include_router(
        advice.router,
        dependencies=[Depends(get_current_user)],
        responses=error_responses(401) | V1_ERRORS,
    )
    app.state.cluster_profiles = settings.cluster_profiles
    app.state.progress_hub = ProgressHub(read_from(settings.database_url))
    # Added last, so outermost: the deadline covers reading the body too; the text guard sees
    # only bodies within the size limit.
    app.add_middleware(TextGuard)
    app.add_middleware(BodyLimit, max_bytes=settings.api.max_request_bytes)
    app.add_middleware(Deadline, seconds=settings.api.request_deadline_s)
    return app
