"""Jobs and their attempts: creation, team-scoped queries, and the records attempts produce."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.db.models import Attempt, Checkpoint, Job, JobEvent, MetricPoint, User, new_id
from service.db.transitions import record_created


class IdempotencyConflict(Exception):
    """An Idempotency-Key was reused with a different job spec."""


def spec_digest(spec: JobSpec) -> str:
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def backend_name(job_name: str, job_id: str, attempt_number: int) -> str:
    """A deterministic, DNS-1123 safe name: a retried submit finds the same object."""
    return f"zp-{job_name[:20].rstrip('-')}-{job_id[:8]}-a{attempt_number}"


def create_job(
    session: Session,
    *,
    spec: JobSpec,
    plan: dict[str, Any],
    advice_reason: str,
    user: User,
    backend: str,
    idempotency_key: str | None,
) -> tuple[Job, bool]:
    """Store a job, PENDING, with attempt 1; return (job, created). Admission (see
    ``service.db.admission``) moves it on.

    With an Idempotency-Key already used by this team, the existing job comes back instead.
    """
    digest = spec_digest(spec)
    if idempotency_key and (existing := _job_by_key(session, user.team_id, idempotency_key)):
        return _same_spec_or_conflict(existing, digest), False
    job = Job(
        id=new_id(),
        name=spec.name,
        team_id=user.team_id,
        user_id=user.id or 0,
        priority=spec.priority,
        cluster=spec.resources.cluster,
        spec=spec.model_dump(mode="json"),
        plan=plan,
        advice_reason=advice_reason,
        idempotency_key=idempotency_key,
        spec_digest=digest,
        current_attempt=1,
    )
    if idempotency_key is None:  # nothing to collide with: no savepoint's round trips
        session.add(job)
        session.flush()  # before its attempt and events, which refer to it
    else:
        try:
            with session.begin_nested():  # a concurrent POST with the same key loses here
                session.add(job)
                session.flush()
        except IntegrityError:
            existing = _job_by_key(session, user.team_id, idempotency_key)
            if existing is None:
                raise
            return _same_spec_or_conflict(existing, digest), False
    record_created(session, job, f"submitted by {user.name}")
    add_attempt(session, job, number=1, plan=plan, rung="advisor", backend=backend)
    return job, True


def add_attempt(
    session: Session,
    job: Job,
    *,
    number: int,
    plan: dict[str, Any],
    rung: str,
    backend: str,
    resumed_from: str | None = None,
    resume_method: str | None = None,
) -> Attempt:
    attempt = Attempt(
        id=new_id(),
        job_id=job.id,
        number=number,
        plan=plan,
        rung=rung,
        backend=backend,
        backend_name=backend_name(job.name, job.id, number),
        resumed_from=resumed_from,
        resume_method=resume_method,
    )
    session.add(attempt)
    session.add(
        JobEvent(
            job_id=job.id,
            subject="attempt",
            attempt_number=number,
            to_status=AttemptStatus.QUEUED,
            reason=f"attempt {number} planned ({rung})",
        )
    )
    session.flush()
    return attempt


def _job_by_key(session: Session, team_id: int, key: str) -> Job | None:
    query = select(Job).where(Job.team_id == team_id, Job.idempotency_key == key)
    return session.exec(query).first()


def _same_spec_or_conflict(job: Job, digest: str) -> Job:
    if job.spec_digest != digest:
        raise IdempotencyConflict(
            f"Idempotency-Key was already used for job {job.id} with a different spec"
        )
    return job


def get_job(session: Session, job_id: str, team_id: int | None) -> Job | None:
    """The job, if it exists and belongs to the team (``None`` team: any, for admins)."""
    job = session.get(Job, job_id)
    if job is None or (team_id is not None and job.team_id != team_id):
        return None
    return job


def list_jobs(
    session: Session,
    team_id: int | None,
    status: JobStatus | None,
    limit: int,
    offset: int,
) -> tuple[Sequence[Job], int]:
    query = select(Job)
    if team_id is not None:
        query = query.where(Job.team_id == team_id)
    if status is not None:
        query = query.where(Job.status == status)
    count = session.exec(select(func.count()).select_from(query.subquery())).one()
    page = (
        query.order_by(col(Job.created_at).desc(), col(Job.id).desc()).offset(offset).limit(limit)
    )
    return session.exec(page).all(), count


def current_attempt(session: Session, job: Job) -> Attempt | None:
    query = select(Attempt).where(Attempt.job_id == job.id, Attempt.number == job.current_attempt)
    return session.exec(query).first()


def attempts_of(session: Session, job_id: str) -> Sequence[Attempt]:
    query = select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.number))
    return session.exec(query).all()


def events_of(session: Session, job_id: str) -> Sequence[JobEvent]:
    query = select(JobEvent).where(JobEvent.job_id == job_id).order_by(col(JobEvent.id))
    return session.exec(query).all()


def metrics_of(session: Session, job_id: str, after_id: int = 0) -> Sequence[MetricPoint]:
    query = (
        select(MetricPoint)
        .where(MetricPoint.job_id == job_id, col(MetricPoint.id) > after_id)
        .order_by(col(MetricPoint.id))
    )
    return session.exec(query).all()


def checkpoints_of(session: Session, job_id: str) -> Sequence[Checkpoint]:
    query = select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(col(Checkpoint.id))
    return session.exec(query).all()


def latest_checkpoint(session: Session, job_id: str) -> Checkpoint | None:
    query = (
        select(Checkpoint)
        .where(Checkpoint.job_id == job_id)
        .order_by(col(Checkpoint.step).desc(), col(Checkpoint.id).desc())
    )
    return session.exec(query).first()


def record_metric(session: Session, attempt: Attempt, values: dict[str, Any]) -> MetricPoint:
    """Store one step's metrics; a repeated report for the same step replaces the first."""
    query = select(MetricPoint).where(
        MetricPoint.attempt_id == attempt.id, MetricPoint.step == values["step"]
    )
    point = session.exec(query).first() or MetricPoint(
        job_id=attempt.job_id, attempt_id=attempt.id, step=values["step"]
    )
    for key in ("loss", "tokens_per_s", "memory_peak_bytes", "extra"):
        setattr(point, key, values.get(key))
    session.add(point)
    session.flush()
    return point


def record_checkpoint(
    session: Session, attempt: Attempt, step: int, path: str, tag: str | None
) -> Checkpoint:
    checkpoint = Checkpoint(
        job_id=attempt.job_id, attempt_id=attempt.id, step=step, path=path, tag=tag
    )
    session.add(checkpoint)
    session.flush()
    return checkpoint
