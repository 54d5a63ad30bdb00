"""What the console's pages need in one request each, beyond the public /v1 resources.

Same bearer tokens and the same visibility as /v1: a member sees their team, an admin every
team. Read-only, except parsing a YAML spec into JSON (nothing stored).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Query, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import Row
from sqlmodel import Session, col, func, select

from service.api.deps import CurrentUser, SessionDep, SettingsDep
from service.core.admission import Limits, admit
from service.core.advisor.constants import DEFAULT_HEADROOM
from service.core.advisor.workload import budget_bytes
from service.core.spec_text import DocumentRefused, load_document
from service.core.states import JobStatus
from service.db import jobs as job_store
from service.db.admission import as_waiting, held, waiting_jobs
from service.db.models import Attempt, Job, Team, User

router = APIRouter(prefix="/console/api", tags=["console"], include_in_schema=False)


class JobRow(BaseModel):
    id: str
    name: str
    team: str
    status: str
    cluster: str
    nodes: int
    gpus_per_node: int
    plan: dict[str, Any]  # the plan's fields without its ds_config
    attempts: int
    preemptions: int  # times another job stopped it to start (docs/scheduling.md)
    borrowing: bool
    message: str
    created_at: datetime
    finished_at: datetime | None


class JobRows(BaseModel):
    data: list[JobRow]
    count: int


class QueuedJob(BaseModel):
    position: int  # 1 = the next to be admitted
    id: str
    name: str
    team: str
    cluster: str
    gpus: int
    priority: int
    submitted_at: datetime
    why: str


class ClusterBudget(BaseModel):
    name: str
    kind: str
    gpu_memory_gib: float
    gpus_per_node: int
    budget_bytes: int  # usable per GPU after the advisor's headroom


@router.get("/jobs", response_model=JobRows)
def job_rows(
    user: CurrentUser,
    session: SessionDep,
    status_filter: Annotated[JobStatus | None, Query(alias="status")] = None,
    team: Annotated[str | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> JobRows:
    """The jobs table: a member's team, or for an admin every team (or the one named)."""
    team_id = _team_scope(session, user, team)
    rows, count = job_store.list_jobs(session, team_id, status_filter, limit, 0)
    names = _team_names(session)
    counts = _attempt_counts(session, [job.id for job in rows])
    return JobRows(data=[_row(job, names, counts) for job in rows], count=count)


@router.get("/queue", response_model=list[QueuedJob])
def queue(user: CurrentUser, session: SessionDep) -> list[QueuedJob]:
    """Waiting jobs in the order admission considers them (priority, fair share, age): for a
    member their team's alone, numbered among themselves; for an admin every team's."""
    names = _team_names(session)
    waiting = waiting_in_order(session, user, names)
    return [_queued(position, job, names) for position, job in enumerate(waiting, start=1)]


def waiting_in_order(session: Session, user: User, names: dict[int, str]) -> list[Row[Any]]:
    """The waiting jobs the user may see, in the order admission considers them."""
    teams = session.exec(select(Team)).all()
    pending = waiting_jobs(session, None if user.is_admin else user.team_id)
    waiting = [as_waiting(job, names) for job in pending]
    # With no quota or cap, admission takes every job, in exactly its order of consideration.
    shares = {team.name: team.gpu_share for team in teams}
    order = admit(waiting, held(session, names), Limits(team_share=shares)).admitted
    by_id = {job.id: job for job in pending}
    return [by_id[job_id] for job_id in order]


@router.get("/clusters", response_model=list[ClusterBudget])
def clusters(_user: CurrentUser, settings: SettingsDep) -> list[ClusterBudget]:
    return [
        ClusterBudget(
            name=profile.name,
            kind=profile.kind,
            gpu_memory_gib=profile.gpu_memory_gib,
            gpus_per_node=profile.gpus_per_node,
            budget_bytes=budget_bytes(profile, DEFAULT_HEADROOM),
        )
        for profile in settings.cluster_profiles().values()
    ]


@router.post("/spec")
def parse_spec(
    _user: CurrentUser, text: Annotated[str, Body(media_type="text/plain")]
) -> JSONResponse:
    """A YAML (or JSON) spec as JSON, so the page can submit a file as written. It is read as
    the CLI reads a spec file (no anchors or aliases, 64 levels, 1 MiB) and serialized here, in
    the handler's thread, not on the event loop."""
    try:
        parsed = load_document(text)
    except DocumentRefused as exc:
        code = 413 if exc.rule == "size" else 422
        raise HTTPException(code, detail=f"the spec {exc}") from exc
    if not isinstance(parsed, dict):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail="not a mapping")
    return JSONResponse(parsed)


def _team_scope(session: Session, user: User, team: str | None) -> int | None:
    if not user.is_admin:
        return user.team_id
    if not team:
        return None  # an admin sees every team
    row = session.exec(select(Team).where(Team.name == team)).first()
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"team {team!r} not found")
    return row.id


def _team_names(session: Session) -> dict[int, str]:
    return {t.id: t.name for t in session.exec(select(Team)).all() if t.id is not None}


def _attempt_counts(session: Session, job_ids: list[str]) -> dict[str, int]:
    query = (
        select(Attempt.job_id, func.count())
        .where(col(Attempt.job_id).in_(job_ids))
        .group_by(Attempt.job_id)
    )
    return {job_id: count for job_id, count in session.exec(query).all()}


def _row(job: Job, names: dict[int, str], counts: dict[str, int]) -> JobRow:
    resources = job.spec["resources"]
    return JobRow(
        id=job.id,
        name=job.name,
        team=names[job.team_id],
        status=job.status,
        cluster=job.cluster,
        nodes=resources["nodes"],
        gpus_per_node=resources["gpus_per_node"],
        plan={key: value for key, value in job.plan.items() if key != "ds_config"},
        attempts=counts.get(job.id, 0),
        preemptions=len(job.preempted_by),
        borrowing=job.borrowing,
        message=job.message,
        created_at=job.created_at,
        finished_at=job.finished_at,
    )


def _queued(position: int, job: Row[Any], names: dict[int, str]) -> QueuedJob:
    return QueuedJob(
        position=position,
        id=job.id,
        name=job.name,
        team=names[job.team_id],
        cluster=job.cluster,
        gpus=job.gpus,
        priority=job.priority,
        submitted_at=job.created_at,
        why=job.message.removeprefix("waiting: ") or "next pass",
    )
