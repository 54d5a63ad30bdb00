"""The progress of every running attempt, read in two statements for the hang watch
(``service.core.progress``): its start, its last step and when it arrived, and its pace."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func
from sqlalchemy import select as sql_select
from sqlmodel import Session, col

from service.core.states import AttemptStatus, JobStatus
from service.db.models import Attempt, Job, MetricPoint, as_utc


@dataclass(frozen=True)
class Running:
    attempt_id: str
    job_id: str
    spec: dict[str, Any]
    plan: dict[str, Any]
    started_at: datetime
    steps: int  # steps reported
    last_step: int | None
    last_step_at: datetime | None
    tokens_per_s: float | None  # the mean of the reported paces


def running_attempts(session: Session) -> list[Running]:
    """Attempts running now whose job runs and that nobody is stopping."""
    query = (
        sql_select(
            col(Attempt.id), col(Job.id), col(Job.spec), col(Attempt.plan), col(Attempt.started_at)
        )
        .join(Job, col(Job.id) == Attempt.job_id)
        .where(
            col(Attempt.status) == AttemptStatus.RUNNING,
            col(Job.status) == JobStatus.RUNNING,
            col(Job.stopping_for).is_(None),
            col(Attempt.stop_grace_s).is_(None),
            col(Attempt.started_at).is_not(None),
        )
    )
    rows = session.execute(query).all()
    paces = _paces(session, [row[0] for row in rows])
    return [
        Running(
            attempt, job, spec, plan, as_utc(started), *paces.get(attempt, (0, None, None, None))
        )
        for attempt, job, spec, plan, started in rows
    ]


def _paces(
    session: Session, attempt_ids: list[str]
) -> dict[str, tuple[int, int | None, datetime | None, float | None]]:
    if not attempt_ids:
        return {}
    query = (
        sql_select(
            col(MetricPoint.attempt_id),
            func.count(),
            func.max(col(MetricPoint.step)),
            func.max(col(MetricPoint.created_at)),
            func.avg(col(MetricPoint.tokens_per_s)),
        )
        .where(col(MetricPoint.attempt_id).in_(attempt_ids))
        .group_by(col(MetricPoint.attempt_id))
    )
    return {
        attempt: (count, step, as_utc(at) if at else None, float(pace) if pace else None)
        for attempt, count, step, at, pace in session.execute(query).all()
    }
