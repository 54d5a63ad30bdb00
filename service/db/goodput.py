"""A job's goodput read from its rows: attempts, checkpoints, and a few of its metric points.

Only the points the timeline needs are read (each attempt's first and last step, and the steps
its checkpoints saved), so a job of a million steps costs a few rows, not a million.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import tuple_
from sqlalchemy.orm import defer
from sqlmodel import Session, col, func, select

from service.core.goodput import HANG_CLASS, AttemptRun, Save, Segment, Step, job_segments
from service.core.states import AttemptStatus
from service.db.jobs import attempts_of
from service.db.models import Attempt, Checkpoint, Job, MetricPoint, as_utc, utcnow

PACE_POINTS = 50  # the measured pace: the median tokens/s of the job's latest points


@dataclass(frozen=True)
class JobTimeline:
    segments: list[Segment]
    tokens_per_s: float | None  # measured, for MFU


def job_timeline(session: Session, job: Job, now: datetime | None = None) -> JobTimeline:
    now = now or utcnow()
    attempts = attempts_of(session, job.id)
    saves = _saves_by_attempt(session, job.id)
    points = _points(session, job, saves)
    runs = [_run(job, attempt, saves.get(attempt.id, []), points, now) for attempt in attempts]
    return JobTimeline(job_segments(runs), measured_pace(session, job.id))


def _saves_by_attempt(session: Session, job_id: str) -> dict[str, list[Checkpoint]]:
    query = select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(col(Checkpoint.id))
    found: dict[str, list[Checkpoint]] = {}
    for checkpoint in session.exec(query):
        found.setdefault(checkpoint.attempt_id, []).append(checkpoint)
    return found


def _points(
    session: Session, job: Job, saves: dict[str, list[Checkpoint]]
) -> dict[tuple[str, int], MetricPoint]:
    """Each attempt's first and last point, and its points at the steps it saved."""
    bounds = select(MetricPoint.attempt_id, func.min(MetricPoint.step), func.max(MetricPoint.step))
    bounds = bounds.where(MetricPoint.job_id == job.id).group_by(col(MetricPoint.attempt_id))
    wanted = {(a, step) for a, low, high in session.exec(bounds) for step in (low, high)}
    wanted |= {(a, c.step) for a, rows in saves.items() for c in rows}
    if not wanted:
        return {}
    pair = tuple_(col(MetricPoint.attempt_id), col(MetricPoint.step))
    query = select(MetricPoint).where(MetricPoint.job_id == job.id, pair.in_(sorted(wanted)))
    return {(p.attempt_id, p.step): p for p in session.exec(query)}


def _run(
    job: Job,
    attempt: Attempt,
    checkpoints: list[Checkpoint],
    points: dict[tuple[str, int], MetricPoint],
    now: datetime,
) -> AttemptRun:
    own = sorted((p for (a, _), p in points.items() if a == attempt.id), key=lambda p: p.step)
    steps = [_step(job, p) for p in own]
    status = AttemptStatus(attempt.status)
    first = steps[0] if steps else None
    start = attempt.started_at and as_utc(attempt.started_at)
    if start is None and first is not None:  # seen only once ended: it ran from its first step
        start = first.at
    end = as_utc(attempt.finished_at or attempt.updated_at) if status.terminal else now
    return AttemptRun(
        number=attempt.number,
        gpus=job.gpus,
        start=start,
        end=end,
        finished_ok=status == AttemptStatus.SUCCEEDED or not status.terminal,
        stopped=status == AttemptStatus.PREEMPTED,
        hung=attempt.failure_class == HANG_CLASS,
        running=not status.terminal,
        resumed_from=attempt.resumed_from,
        first=first,
        last=steps[-1] if steps else None,
        at_saves={s.step: s for s in steps},
        saves=[_save(c) for c in checkpoints],
    )


def _step(job: Job, point: MetricPoint) -> Step:
    training = job.spec.get("training", {})
    tokens = training.get("global_batch_size", 0) * training.get("sequence_length", 0)
    seconds = tokens / point.tokens_per_s if point.tokens_per_s else 0.0
    return Step(point.step, as_utc(point.created_at), seconds)


def _save(checkpoint: Checkpoint) -> Save:
    at = as_utc(checkpoint.created_at)
    return Save(checkpoint.step, checkpoint.path, at, checkpoint.save_seconds or 0.0)


def measured_pace(session: Session, job_id: str, points: int = PACE_POINTS) -> float | None:
    """The median tokens/s of the job's latest points that carry one."""
    query = (
        select(MetricPoint.tokens_per_s)
        .where(MetricPoint.job_id == job_id, col(MetricPoint.tokens_per_s).is_not(None))
        .order_by(col(MetricPoint.id).desc())
        .limit(points)
    )
    rates: Sequence[float | None] = session.exec(query).all()
    found = [rate for rate in rates if rate]
    return statistics.median(found) if found else None


def jobs_in_window(
    session: Session, team_id: int, since: datetime, until: datetime
) -> Sequence[Job]:
    """The team's jobs that may have held GPUs in [since, until] (their plans left unread)."""
    query = (
        select(Job)
        .options(defer(Job.plan))  # type: ignore[arg-type]  # a JSON column's attribute
        .where(
            Job.team_id == team_id,
            col(Job.created_at) <= until,
            col(Job.finished_at).is_(None) | (col(Job.finished_at) >= since),
        )
    )
    return session.exec(query.order_by(col(Job.created_at))).all()
