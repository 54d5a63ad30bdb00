"""What a job wrote, as it reads back: an attempt's log, the job's metric points and the
checkpoints it reported (``/v1/jobs/{id}/logs``, ``/metrics``, ``/checkpoints``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status

from service.api.deps import CurrentUser, SessionDep, SettingsDep, visible_job
from service.api.errors import error_responses
from service.api.job_logs import attempt_log
from service.api.schemas import CheckpointPublic, LogsPublic, MetricPublic
from service.core.limits import INT32_MAX, INT64_MAX
from service.db import jobs as job_store
from service.db.jobs import DETAIL_ROWS

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401))


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
    job = visible_job(session, user, job_id)
    number = attempt or job.current_attempt
    row = next((a for a in job_store.attempts_of(session, job.id) if a.number == number), None)
    if row is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, detail=f"job {job.id} has no attempt {number}"
        )
    logs, next_offset = attempt_log(settings, job.cluster, row, tail, offset)
    if next_offset is not None:
        response.headers["X-Next-Offset"] = str(next_offset)
    return logs


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
    job = visible_job(session, user, job_id)
    points = job_store.metrics_of(session, job.id, after_id, limit)
    return [MetricPublic.model_validate(p) for p in points]


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
    job = visible_job(session, user, job_id)
    rows = job_store.checkpoints_of(session, job.id, after_id, limit)
    return [CheckpointPublic.model_validate(c) for c in rows]
