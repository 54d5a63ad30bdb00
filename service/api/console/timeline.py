"""The console's timeline: per cluster, the jobs holding GPUs until their predicted ends and the
waiting jobs from their predicted starts to their ends (docs/scheduling.md).

The waiting jobs' predictions are the stored ones (the admission pass makes them); the holders'
ends are computed here by the same pure ``predicted_end`` the pass uses, so both halves of the
picture rest on the same rules. Same visibility as the queue: a member sees their team's jobs.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel
from sqlalchemy import Row
from sqlmodel import Session, col, select

from service.api.console.data import waiting_in_order
from service.api.deps import CurrentUser, SessionDep
from service.core.forecast import UNKNOWN, Holding, predicted_end
from service.db.forecast import holding_jobs
from service.db.models import Job, Team, User, as_utc, utcnow

router = APIRouter(prefix="/console/api", tags=["console"], include_in_schema=False)
NOT_YET = "not predicted yet: the next admission pass predicts it"


class Bar(BaseModel):
    """One job on the timeline; a missing start or end is not known, and ``basis`` says why."""

    id: str
    name: str
    team: str
    status: str
    gpus: int
    start_at: datetime | None
    end_at: datetime | None
    basis: str
    predicted_at: datetime | None  # when a waiting job's prediction was made


class ClusterTimeline(BaseModel):
    cluster: str
    holding: list[Bar]  # soonest end first
    waiting: list[Bar]  # in admission order


class Timeline(BaseModel):
    now: datetime  # the server's clock: the page draws its "now" line here
    clusters: list[ClusterTimeline]


@router.get("/timeline", response_model=Timeline)
def timeline(user: CurrentUser, session: SessionDep) -> Timeline:
    """Every cluster with a job held or waiting that the user may see."""
    now = utcnow()
    names = {t.id: t.name for t in session.exec(select(Team)).all() if t.id is not None}
    holding = _holding_bars(session, user, names, now)
    waiting = _waiting_bars(session, user, names)
    clusters = sorted({bar_cluster for bar_cluster, _bar in [*holding, *waiting]})
    return Timeline(
        now=now,
        clusters=[
            ClusterTimeline(
                cluster=name,
                holding=sorted((b for c, b in holding if c == name), key=_end_order),
                waiting=[b for c, b in waiting if c == name],
            )
            for name in clusters
        ],
    )


def _holding_bars(
    session: Session, user: User, names: dict[int, str], now: datetime
) -> list[tuple[str, Bar]]:
    mine = None if user.is_admin or user.team_id is None else names[user.team_id]
    holders = [h for h in holding_jobs(session, names) if mine is None or h.team == mine]
    ids = [h.job_id for h in holders]
    rows = session.exec(select(Job.id, Job.name, Job.status).where(col(Job.id).in_(ids))).all()
    by_id = {job_id: (name, status) for job_id, name, status in rows}
    return [(h.cluster, _holding_bar(h, *by_id[h.job_id], now)) for h in holders]


def _holding_bar(job: Holding, name: str, status: str, now: datetime) -> Bar:
    end_s, why = predicted_end(job, now)
    end = None if end_s == UNKNOWN else now + timedelta(seconds=end_s)
    start = job.started_at
    basis = f"end: {why}" if start else f"end: {why}; not started yet ({status})"
    return Bar(id=job.job_id, name=name, team=job.team, status=status, gpus=job.gpus,
               start_at=start, end_at=end, basis=basis, predicted_at=now)  # fmt: skip


def _waiting_bars(session: Session, user: User, names: dict[int, str]) -> list[tuple[str, Bar]]:
    return [
        (job.cluster, _waiting_bar(job, names)) for job in waiting_in_order(session, user, names)
    ]


def _waiting_bar(job: Row[Any], names: dict[int, str]) -> Bar:
    start, end = job.predicted_start_at, job.predicted_end_at
    return Bar(
        id=job.id, name=job.name, team=names[job.team_id], status="PENDING", gpus=job.gpus,
        start_at=as_utc(start) if start else None, end_at=as_utc(end) if end else None,
        basis=job.prediction_basis or NOT_YET,
        predicted_at=as_utc(job.predicted_at) if job.predicted_at else None,
    )  # fmt: skip


def _end_order(bar: Bar) -> tuple[bool, float]:
    return (bar.end_at is None, bar.end_at.timestamp() if bar.end_at else 0.0)
