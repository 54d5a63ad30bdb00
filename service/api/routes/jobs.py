"""Job routes: submit, list, inspect, cancel, and read logs, metrics and checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from sqlmodel import Session, col, select

from service.api.deps import Credentials, CurrentUser, SessionDep, SettingsDep, WriterUser
from service.api.errors import error_responses
from service.api.job_progress import NoSuchJob, ProgressHub, Seen, ShuttingDown
from service.api.schemas import (
    CheckpointPublic,
    JobDetail,
    JobPublic,
    JobsPublic,
    LogsPublic,
    MetricPublic,
    ProgressPublic,
)
from service.api.submitting import IDEMPOTENCY_KEY_MAX, IDEMPOTENCY_KEY_PATTERN, submit
from service.contained_files import NotContained
from service.core.clusters import BackendKind
from service.core.limits import INT32_MAX, INT64_MAX
from service.core.spec import JobSpec
from service.core.states import JobStatus
from service.db import jobs as job_store
from service.db.jobs import DETAIL_ROWS
from service.db.models import Checkpoint, Job, MetricPoint, Team, User
from service.db.transitions import move_job
from service.logtail import log_size, read_from, tail_lines
from service.settings import Settings
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
    names = _team_names(session)
    data = [JobPublic.model_validate({**row, "team": names[row["team_id"]]}) for row in rows]
    return JobsPublic(data=data, count=count)


@router.get("/{job_id}", response_model=JobDetail, responses=error_responses(404))
def get_job(job_id: str, user: CurrentUser, session: SessionDep) -> JobDetail:
    job = _visible_job(session, user, job_id)
    record = job_store.job_record(session, job, _team_names(session)[job.team_id])
    return JobDetail.model_validate(record)


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=error_responses(403, 404, 409))
def cancel_job(
    job_id: str, user: WriterUser, session: SessionDep, settings: SettingsDep
) -> JobPublic:
    """Mark the job cancelled; a worker then stops its processes on the cluster."""
    job = _visible_job(session, user, job_id)
    if JobStatus(job.status).terminal:
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"job {job.id} already ended as {job.status}"
        )
    moved = move_job(
        session, job, JobStatus.active(), JobStatus.CANCELLED, f"cancelled by {user.name}"
    )
    session.commit()
    if moved and (attempt := job_store.current_attempt(session, job)) is not None:
        _enqueue(settings, CANCEL_ATTEMPT, attempt.id)
    fields = job_store.job_fields(job)
    return JobPublic.model_validate({**fields, "team": _team_names(session)[job.team_id]})


@router.get("/{job_id}/logs", response_model=LogsPublic, responses=error_responses(404, 409))
def job_logs(
    job_id: str,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    attempt: Annotated[int | None, Query(ge=1, le=INT32_MAX)] = None,
    tail: Annotated[int, Query(ge=1, le=10000)] = 200,
    offset: Annotated[
        int | None, Query(ge=0, le=INT64_MAX, description="follow: bytes already read")
    ] = None,
) -> LogsPublic:
    """The tail of an attempt's log, or (with ``offset``) what was appended since."""
    job = _visible_job(session, user, job_id)
    number = attempt or job.current_attempt
    row = next((a for a in job_store.attempts_of(session, job.id) if a.number == number), None)
    if row is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, detail=f"job {job.id} has no attempt {number}"
        )
    if not row.log_path:
        launched = row.backend_ref is not None
        return LogsPublic(
            attempt=number, text=_why_no_log(settings, job.cluster) if launched else ""
        )
    root, path = settings.attempts_dir, Path(row.log_path)
    try:
        if offset is None:  # the tail, and where a follower should continue from
            response.headers["X-Next-Offset"] = str(log_size(root, path))
            return LogsPublic(attempt=number, text=tail_lines(root, path, tail))
        text, next_offset = read_from(root, path, offset)
    except NotContained as exc:  # the job swapped its log for a link: never read through it
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"attempt {number}'s log is not readable: {exc}"
        ) from exc
    response.headers["X-Next-Offset"] = str(next_offset)
    return LogsPublic(attempt=number, text=text)


@router.get("/{job_id}/metrics", response_model=list[MetricPublic], responses=error_responses(404))
def job_metrics(
    job_id: str,
    user: CurrentUser,
    session: SessionDep,
    after_id: Annotated[
        int, Query(ge=0, le=INT32_MAX, description="only points newer than this id")
    ] = 0,
    limit: Annotated[
        int, Query(ge=1, le=DETAIL_ROWS, description="at most this many, oldest first")
    ] = DETAIL_ROWS,
) -> list[MetricPublic]:
    """A job's metric points in order; page with ``after_id`` = the last id received."""
    job = _visible_job(session, user, job_id)
    query = select(MetricPoint).where(MetricPoint.job_id == job.id, col(MetricPoint.id) > after_id)
    points = session.exec(query.order_by(col(MetricPoint.id)).limit(limit)).all()
    return [MetricPublic.model_validate(p) for p in points]


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
        _visible_job(session, user, job_id)
    finally:
        session.close()


@router.get(
    "/{job_id}/checkpoints",
    response_model=list[CheckpointPublic],
    responses=error_responses(404),
)
def job_checkpoints(
    job_id: str,
    user: CurrentUser,
    session: SessionDep,
    after_id: Annotated[
        int, Query(ge=0, le=INT32_MAX, description="only checkpoints newer than this id")
    ] = 0,
    limit: Annotated[
        int, Query(ge=1, le=DETAIL_ROWS, description="at most this many, oldest first")
    ] = DETAIL_ROWS,
) -> list[CheckpointPublic]:
    """A job's reported checkpoints in order; page with ``after_id`` = the last id received."""
    job = _visible_job(session, user, job_id)
    query = select(Checkpoint).where(Checkpoint.job_id == job.id, col(Checkpoint.id) > after_id)
    rows = session.exec(query.order_by(col(Checkpoint.id)).limit(limit)).all()
    return [CheckpointPublic.model_validate(c) for c in rows]


def _enqueue(settings: Settings, task: str, attempt_id: str) -> None:
    send_or_leave_to_sweep(settings.broker_url, task, attempt_id)


def _team_names(session: Session) -> dict[int, str]:
    return {t.id: t.name for t in session.exec(select(Team)).all() if t.id is not None}


def _team_filter(session: Session, user: User, team: str | None) -> int | None:
    if team is None:
        return user.team_id
    if not user.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="only admins may list other teams")
    row = session.exec(select(Team).where(Team.name == team)).first()
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"team {team!r} not found")
    return row.id


def _why_no_log(settings: Settings, cluster: str) -> str:
    """Why a launched attempt has no log file the API can read (none on Kubernetes without
    the shared volume; the others always have one)."""
    profile = settings.cluster_profiles().get(cluster)
    if profile is None or profile.kind != BackendKind.KUBERNETES:
        return ""
    if profile.shared_volume_claim is None:
        return (
            f"(no log here: the pods of cluster {cluster} mount no shared volume (its profile's "
            "shared_volume_claim), so their output stays with the pods: read it with kubectl "
            "logs)"
        )
    return (
        f"(no log here: the attempt folders are not under {profile.shared_volume_path}, where "
        f"the pods of cluster {cluster} mount the shared volume, so they could not write it)"
    )


def _visible_job(session: Session, user: User, job_id: str) -> Job:
    # Another team's job is "not found", not "forbidden": its existence is not disclosed.
    job = job_store.get_job(session, job_id, None if user.is_admin else user.team_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"job {job_id} not found")
    return job
