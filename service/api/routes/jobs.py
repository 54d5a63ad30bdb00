"""Job routes: submit, list, inspect, follow and cancel (what a job wrote: ``job_outputs``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from sqlmodel import Session

from service.api.deps import (
    Credentials,
    CurrentUser,
    SessionDep,
    SettingsDep,
    WriterUser,
    visible_job,
)
from service.api.errors import error_responses
from service.api.goodput import job_goodput
from service.api.job_progress import NoSuchJob, ProgressHub, Seen, ShuttingDown
from service.api.schemas import JobDetail, JobPublic, JobsPublic, ProgressPublic
from service.api.submitting import IDEMPOTENCY_KEY_MAX, IDEMPOTENCY_KEY_PATTERN, submit
from service.core.limits import INT32_MAX
from service.core.spec import JobSpec
from service.core.states import JobStatus
from service.db import jobs as job_store
from service.db.models import User
from service.db.transitions import move_job
from service.db.users import team_id_named, team_names
from service.tasks import CANCEL_ATTEMPT, send_or_leave_to_sweep

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401))
WAIT_MAX_S = 25.0  # a long poll's longest hold
WAIT_SHARE_OF_DEADLINE = 0.8


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobDetail,
    responses=error_responses(403, 409),
)
async def create_job(
    spec: JobSpec,
    credentials: Credentials,
    settings: SettingsDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=IDEMPOTENCY_KEY_MAX,
            pattern=IDEMPOTENCY_KEY_PATTERN,
            description="a retried submit with the same key returns the job the first stored",
        ),
    ] = None,
) -> Response:
    """Validate, plan and store a job; its launch is queued once the row is committed."""
    # One hop to a worker thread for all of it (caller, session, submit): as dependencies and a
    # sync handler it took four, and the hops cost the API about as much CPU as the submit.
    return await run_in_threadpool(submit, spec, credentials, settings, idempotency_key)


def create_job_route() -> APIRoute:
    """The submit's route: its contract (OpenAPI, the refusals of a malformed request)."""
    return next(
        route
        for route in router.routes
        if isinstance(route, APIRoute)
        and route.path == router.prefix
        and "POST" in (route.methods or ())
    )


# What a listing shows (JobPublic) and reads: the team's id, not its name; never spec or plan.
LISTED_FIELDS = [name for name in JobPublic.model_fields if name != "team"] + ["team_id"]
# A listing leads to its first job (OpenAPI links: clients and stateful fuzzers follow them).
FIRST_JOB = {"job_id": "$response.body#/data/0/id"}
LIST_LINKS = {
    name: {"operationRef": f"#/paths/~1v1~1jobs~1{{job_id}}{suffix}", "parameters": FIRST_JOB}
    for name, suffix in [
        ("GetJob", "/get"),
        ("CancelJob", "~1cancel/post"),
        ("JobLogs", "~1logs/get"),
        ("JobMetrics", "~1metrics/get"),
        ("JobCheckpoints", "~1checkpoints/get"),
    ]
}


@router.get(
    "",
    response_model=JobsPublic,
    responses=error_responses(403, 404) | {200: {"description": "Jobs", "links": LIST_LINKS}},
)
def list_jobs(
    user: CurrentUser,
    session: SessionDep,
    status_filter: Annotated[JobStatus | None, Query(alias="status")] = None,
    team: Annotated[str | None, Query(description="admins only: another team's jobs")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> JobsPublic:
    """The caller's team's jobs, newest first."""
    team_id = _team_filter(session, user, team)
    rows, count = job_store.list_job_fields(
        session, LISTED_FIELDS, team_id, status_filter, limit, offset
    )
    names = team_names(session)
    data = [JobPublic.model_validate({**row, "team": names[row["team_id"]]}) for row in rows]
    return JobsPublic(data=data, count=count)


@router.get("/{job_id}", response_model=JobDetail, responses=error_responses(404))
def get_job(
    job_id: str, user: CurrentUser, session: SessionDep, settings: SettingsDep
) -> JobDetail:
    job = visible_job(session, user, job_id)
    record = job_store.job_record(session, job, team_names(session)[job.team_id])
    goodput = job_goodput(session, job, settings.cluster_profiles())
    return JobDetail.model_validate({**record, "goodput": goodput})


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=error_responses(403, 404, 409))
def cancel_job(
    job_id: str, user: WriterUser, session: SessionDep, settings: SettingsDep
) -> JobPublic:
    """Mark the job cancelled; a worker then stops its processes on the cluster."""
    job = visible_job(session, user, job_id)
    if JobStatus(job.status).terminal:
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"job {job.id} already ended as {job.status}"
        )
    moved = move_job(
        session, job, JobStatus.active(), JobStatus.CANCELLED, f"cancelled by {user.name}"
    )
    session.commit()
    if moved and (attempt := job_store.current_attempt(session, job)) is not None:
        send_or_leave_to_sweep(settings.broker_url, CANCEL_ATTEMPT, attempt.id)
    fields = job_store.job_fields(job)
    return JobPublic.model_validate({**fields, "team": team_names(session)[job.team_id]})


@router.get("/{job_id}/wait", response_model=ProgressPublic, responses=error_responses(404))
async def wait_for_job(
    job_id: str,
    request: Request,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    seen_status: Annotated[
        JobStatus | None, Query(alias="status", description="the status last seen")
    ] = None,
    events_after: Annotated[
        int, Query(ge=0, le=INT32_MAX, description="the id of the newest event seen")
    ] = 0,
    metrics_after: Annotated[
        int, Query(ge=0, le=INT32_MAX, description="the id of the newest metric point seen")
    ] = 0,
    timeout_s: Annotated[
        float, Query(ge=1, le=WAIT_MAX_S, description="answer unchanged after this long")
    ] = WAIT_MAX_S,
) -> ProgressPublic:
    """Held until the job moves past what the caller has seen (a new status or event at once,
    new metrics within a second) or until ``timeout_s``, then where it stands. A job that has
    ended answers at once."""
    await run_in_threadpool(_visible_then_released, session, user, job_id)
    hub: ProgressHub = request.app.state.progress_hub
    seen = Seen(seen_status, events_after, metrics_after)
    # Answered inside the request deadline (the middleware would cut a longer hold with 504).
    timeout = min(timeout_s, settings.api.request_deadline_s * WAIT_SHARE_OF_DEADLINE)
    try:
        changed, progress = await hub.wait(job_id, seen, timeout)
    except NoSuchJob as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"job {job_id} not found") from exc
    except ShuttingDown as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail="the API is stopping; ask again",
            headers={"Retry-After": "1"},
        ) from exc
    return ProgressPublic(
        changed=changed,
        status=progress.status,
        last_event_id=progress.last_event_id,
        last_metric_id=progress.last_metric_id,
    )


def _visible_then_released(session: Session, user: User, job_id: str) -> None:
    """404 unless the caller may see the job; then the session's connection goes back to the
    pool, so a held request holds none (the hub reads for every waiter at once)."""
    try:
        visible_job(session, user, job_id)
    finally:
        session.close()


def _team_filter(session: Session, user: User, team: str | None) -> int | None:
    if team is None:
        return user.team_id
    if not user.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="only admins may list other teams")
    if (team_id := team_id_named(session, team)) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"team {team!r} not found")
    return team_id
