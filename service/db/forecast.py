"""The snapshot that predictions and backfill read, and the predictions written back.

The jobs holding GPUs come in one statement: each one's length, its current attempt's start and
the first and last steps that attempt reported, with when (``service.core.forecast`` turns them
into a measured step time and an end). The predictions go back in one executemany, only for
the jobs whose prediction moved, so a steady backlog costs no writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, and_, update
from sqlalchemy import select as sql_select
from sqlmodel import Session, col

from service.core.admission import HOLDING
from service.core.forecast import Holding, Length, Prediction, Progress
from service.db.models import Attempt, Job, MetricPoint, as_utc

# A prediction is written again once it moves by this much, or by this share of the wait left:
# each report of a running job moves its end by a little, and a write per job per pass would
# cost a busy backlog thousands of updates every few seconds.
MOVED_S = 2.0
MOVED_SHARE = 0.02


def holding_jobs(session: Session, team_names: Mapping[int, str]) -> list[Holding]:
    """Every job holding GPUs, with what is known of its length and progress."""
    attempt = (
        sql_select(col(Attempt.id), col(Attempt.job_id), col(Attempt.started_at))
        .join(Job, and_(col(Attempt.job_id) == Job.id, col(Attempt.number) == Job.current_attempt))
        .where(col(Job.status).in_(HOLDING))
        .subquery()
    )
    query = (
        sql_select(
            col(Job.id), col(Job.team_id), col(Job.cluster), col(Job.gpus), col(Job.steps),
            col(Job.step_s), col(Job.time_limit_s), attempt.c.started_at,
            *_report(attempt.c.id, first=True), *_report(attempt.c.id, first=False),
        )
        .where(col(Job.status).in_(HOLDING))
        .outerjoin(attempt, attempt.c.job_id == Job.id)
    )  # fmt: skip
    return [_holding(row, team_names) for row in session.execute(query).all()]


def _report(attempt_id: Any, first: bool) -> tuple[Any, Any]:
    """The attempt's first (or last) reported step and when it came: two probes of the
    (attempt_id, step) index, however many steps it reported."""
    name = "first" if first else "last"
    order = col(MetricPoint.step) if first else col(MetricPoint.step).desc()

    def probe(column: Any) -> Any:
        query = sql_select(column).where(col(MetricPoint.attempt_id) == attempt_id)
        return query.order_by(order).limit(1).scalar_subquery()

    step = probe(col(MetricPoint.step)).label(f"{name}_step")
    at = probe(col(MetricPoint.created_at)).label(f"{name}_at")
    return step, at


def _holding(row: Row[Any], team_names: Mapping[int, str]) -> Holding:
    progress = None
    if row.last_step is not None:
        progress = Progress(
            row.first_step, as_utc(row.first_at), row.last_step, as_utc(row.last_at)
        )
    started = as_utc(row.started_at) if row.started_at else None
    return Holding(row.id, team_names[row.team_id], row.cluster, row.gpus,
                   length_of(row), started, progress)  # fmt: skip


def length_of(row: Row[Any]) -> Length:
    return Length(row.steps, row.step_s, row.time_limit_s)


def write_predictions(
    session: Session,
    pending: Sequence[Row[Any]],
    predictions: Mapping[str, Prediction],
    now: datetime,
) -> int:
    """Store the predictions that moved; the first of a wait is kept apart. How many moved."""
    changed = [
        _values(job, predictions[job.id], now)
        for job in pending
        if job.id in predictions and _moved(job, predictions[job.id], now)
    ]
    if changed:
        session.execute(update(Job), changed)  # by primary key, one executemany
    return len(changed)


def _values(job: Row[Any], predicted: Prediction, now: datetime) -> dict[str, Any]:
    values: dict[str, Any] = {
        "id": job.id,
        "predicted_start_at": predicted.start_at,
        "predicted_end_at": predicted.end_at,
        "prediction_basis": predicted.basis,
        "predicted_at": now,
        "first_predicted_start_at": job.first_predicted_start_at,
        "first_predicted_at": job.first_predicted_at,
    }
    if predicted.start_at is not None and not _first_of_this_wait(job):
        values["first_predicted_start_at"], values["first_predicted_at"] = predicted.start_at, now
    return values


def _first_of_this_wait(job: Row[Any]) -> bool:
    """Whether the job has a first prediction made since it last began to wait (a preempted
    job waits again from ``requeued_at``)."""
    if job.first_predicted_at is None:
        return False
    return job.requeued_at is None or as_utc(job.first_predicted_at) >= as_utc(job.requeued_at)


def _moved(job: Row[Any], predicted: Prediction, now: datetime) -> bool:
    if job.prediction_basis == "" or (not _first_of_this_wait(job) and predicted.start_at):
        return True
    return _apart(job.predicted_start_at, predicted.start_at, now) or _apart(
        job.predicted_end_at, predicted.end_at, now
    )


def _apart(stored: datetime | None, new: datetime | None, now: datetime) -> bool:
    if stored is None or new is None:
        return (stored is None) != (new is None)
    stored = as_utc(stored)
    allowed = max(MOVED_S, MOVED_SHARE * abs((new - now).total_seconds()))
    return abs((new - stored).total_seconds()) > allowed


def start_error_s(job: Job, now: datetime) -> float | None:
    """Seconds the job starts after its first prediction of this wait (negative: before)."""
    if job.first_predicted_start_at is None or job.first_predicted_at is None:
        return None
    if job.requeued_at is not None and as_utc(job.first_predicted_at) < as_utc(job.requeued_at):
        return None  # that prediction was for an earlier wait
    return (now - as_utc(job.first_predicted_start_at)).total_seconds()
