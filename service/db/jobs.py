"""Jobs and their attempts: creation, team-scoped queries, and the records attempts produce."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Select
from sqlalchemy import select as sql_select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from service.core.attempt_kinds import AttemptKind
from service.core.placement import AUTO as AUTO_CLUSTER
from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.db.models import (
    Attempt,
    Checkpoint,
    Job,
    JobEvent,
    MetricPoint,
    Team,
    User,
    new_id,
    utcnow,
)
from service.db.new_job import write_new_job
from service.db.rows import Row, new_row
from service.db.session import in_autocommit
from service.db.transitions import admit_on_creation, record_created
from service.db.users import Caller
from zeropilot.resume import ResumeMethod

SelectT = TypeVar("SelectT", bound=Select[Any])
# session.info key: the events of jobs written as plain rows, with their cluster and team.
NEW_JOB_EVENTS = "zeropilot_new_job_events"
# A job's detail carries at most this many of its latest events, metrics and checkpoints, so
# its size is bounded however long the job runs; the metrics and checkpoints reads page.
DETAIL_ROWS = 10_000


class IdempotencyConflict(Exception):
    """An Idempotency-Key was reused with a different job spec."""


def spec_digest(spec: JobSpec) -> str:
    return _digest(spec.model_dump(mode="json"))


def _digest(spec: dict[str, Any]) -> str:
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def backend_name(job_name: str, job_id: str, attempt_number: int) -> str:
    """A deterministic, DNS-1123 safe name: a retried submit finds the same object."""
    return f"zp-{job_name[:20].rstrip('-')}-{job_id[:8]}-a{attempt_number}"


@dataclass(frozen=True)
class NewJob:
    """A job as a submit wrote it, as rows: the answer is built from these, not read back."""

    job: Row
    attempt: Row
    events: list[Row]


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
    """Store a job, PENDING, with attempt 1; return (job, created), the job loaded in the
    session for callers that go on with it. Admission (``service.db.admission``) moves it on."""
    team = session.get(Team, user.team_id)
    assert team is not None
    stored = store_job(
        session,
        spec=spec,
        plan=plan,
        advice_reason=advice_reason,
        caller=Caller.of(user, team),
        backend=backend,
        idempotency_key=idempotency_key,
    )
    if isinstance(stored, Job):
        return stored, False
    job = session.get(Job, stored.job["id"])
    assert job is not None
    return job, True


def store_job(
    session: Session,
    *,
    spec: JobSpec,
    plan: dict[str, Any],
    advice_reason: str,
    caller: Caller,
    backend: str,
    idempotency_key: str | None,
    admitted: bool = False,
    waiting: str = "",
    cluster: str | None = None,
) -> NewJob | Job:
    """Store a job with attempt 1 and their events (``new_job``: one statement on PostgreSQL).
    ``admitted``: it enters QUEUED (the caller decided under the admission rules), else PENDING
    with ``waiting`` as its message. ``cluster``: where placement put a ``cluster: auto`` job
    (the spec is stored as submitted).

    With an Idempotency-Key already used by this team, the existing job comes back instead.
    """
    stored_spec = spec.model_dump(mode="json")
    digest = _digest(stored_spec)
    job = new_row(
        Job,
        id=new_id(),
        name=spec.name,
        team_id=caller.team_id,
        user_id=caller.user_id,
        priority=spec.priority,
        cluster=cluster or spec.resources.cluster,
        gpus=spec.resources.world_size,
        steps=spec.training.steps,
        step_s=spec.training.step_seconds(plan.get("tokens_per_second")),
        time_limit_s=_time_limit_s(spec),
        placed_at=utcnow() if spec.resources.cluster == AUTO_CLUSTER else None,
        spec=stored_spec,
        plan=plan,
        advice_reason=advice_reason,
        idempotency_key=idempotency_key,
        spec_digest=digest,
        current_attempt=1,
        message=waiting,
    )
    attempt = new_row(
        Attempt,
        id=new_id(),
        job_id=job["id"],
        number=1,
        plan=plan,
        kind=AttemptKind.ADVISOR,
        rung="advisor",
        backend=backend,
        backend_name=backend_name(job["name"], job["id"], 1),
    )
    events = [  # as they happen: the job, its attempt, its admission
        record_created(job["id"], f"submitted by {caller.user_name}"),
        new_row(JobEvent, **_attempt_planned(job["id"], 1, "advisor")),
    ]
    held = None
    if admitted:  # QUEUED from the start; its GPUs counted with the insert
        admission, held = admit_on_creation(job)
        events.append(admission)
    # A reused key makes the write fail: looked up then, a replay being the rare case. Inside a
    # transaction a savepoint keeps the failure from aborting it; in autocommit there is none.
    if idempotency_key is None or in_autocommit(session):
        written: AbstractContextManager[object] = nullcontext()
    else:
        written = session.begin_nested()  # a concurrent POST with the same key loses here
    try:
        with written:
            write_new_job(session, job, attempt, events, held)
    except IntegrityError:
        existing = idempotency_key and _job_by_key(session, caller.team_id, idempotency_key)
        if not existing:
            raise
        return _same_spec_or_conflict(existing, digest)
    # Counted by service.metrics once the transaction commits: the hot path bypasses the ORM.
    session.info.setdefault(NEW_JOB_EVENTS, []).append((events, job["cluster"], caller.team_name))
    return NewJob(job, attempt, events)


def _attempt_planned(job_id: str, number: int, rung: str) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "subject": "attempt",
        "attempt_number": number,
        "to_status": AttemptStatus.QUEUED,
        "reason": f"attempt {number} planned ({rung})",
    }


def add_attempt(
    session: Session,
    job: Job,
    *,
    kind: AttemptKind,
    number: int,
    plan: dict[str, Any],
    rung: str,
    backend: str,
    resumed_from: str | None = None,
    resume_method: ResumeMethod | None = None,
) -> Attempt:
    """The attempt row and its event; attempt N+1 is ``service.db.attempts.next_attempt``'s."""
    attempt = Attempt(
        id=new_id(),
        job_id=job.id,
        number=number,
        plan=plan,
        kind=kind,
        rung=rung,
        backend=backend,
        backend_name=backend_name(job.name, job.id, number),
        resumed_from=resumed_from,
        resume_method=resume_method,
    )
    session.add(attempt)
    session.add(JobEvent(**_attempt_planned(job.id, number, rung)))
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
    """A page of whole jobs, newest first, and how many match."""
    query = _newest_first(select(Job), team_id, status).offset(offset).limit(limit)
    return session.exec(query).all(), _count_jobs(session, team_id, status)


def list_job_fields(
    session: Session,
    fields: Sequence[str],
    team_id: int | None,
    status: JobStatus | None,
    limit: int,
    offset: int,
) -> tuple[list[dict[str, Any]], int]:
    """A page of jobs as ``fields`` alone, newest first, and how many match: a listing loads
    no spec or plan it does not show (each up to a megabyte)."""
    columns = [col(getattr(Job, name)) for name in fields]
    query = _newest_first(sql_select(*columns), team_id, status).offset(offset).limit(limit)
    rows = session.execute(query).all()
    return [dict(row._mapping) for row in rows], _count_jobs(session, team_id, status)


def _newest_first(query: SelectT, team_id: int | None, status: JobStatus | None) -> SelectT:
    return _matching(query, team_id, status).order_by(
        col(Job.created_at).desc(), col(Job.id).desc()
    )


def _matching(query: SelectT, team_id: int | None, status: JobStatus | None) -> SelectT:
    if team_id is not None:
        query = query.where(col(Job.team_id) == team_id)
    if status is not None:
        query = query.where(col(Job.status) == status)
    return query


def _count_jobs(session: Session, team_id: int | None, status: JobStatus | None) -> int:
    return session.exec(_matching(select(func.count()).select_from(Job), team_id, status)).one()


def current_attempt(session: Session, job: Job) -> Attempt | None:
    query = select(Attempt).where(Attempt.job_id == job.id, Attempt.number == job.current_attempt)
    return session.exec(query).first()


def attempts_of(session: Session, job_id: str) -> Sequence[Attempt]:
    query = select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.number))
    return session.exec(query).all()


def events_of(session: Session, job_id: str) -> Sequence[JobEvent]:
    query = select(JobEvent).where(JobEvent.job_id == job_id).order_by(col(JobEvent.id))
    return session.exec(query).all()


def metrics_of(
    session: Session, job_id: str, after_id: int = 0, limit: int = DETAIL_ROWS
) -> Sequence[MetricPoint]:
    """A job's metric points after ``after_id``, oldest first, at most ``limit``."""
    query = (
        select(MetricPoint)
        .where(MetricPoint.job_id == job_id, col(MetricPoint.id) > after_id)
        .order_by(col(MetricPoint.id))
    )
    return session.exec(query.limit(limit)).all()


@dataclass(frozen=True)
class Progress:
    """How far a job has come, as a follower sees it: its status and its newest rows' ids."""

    status: JobStatus
    last_event_id: int
    last_metric_id: int


def progress_of(session: Session, job_ids: Sequence[str]) -> dict[str, Progress]:
    """The progress of each of these jobs that exists, in one statement however many."""
    job_id = col(Job.id)
    newest_event = (
        sql_select(func.max(JobEvent.id)).where(col(JobEvent.job_id) == job_id).scalar_subquery()
    )
    newest_metric = (
        sql_select(func.max(MetricPoint.id))
        .where(col(MetricPoint.job_id) == job_id)
        .scalar_subquery()
    )
    query = sql_select(job_id, col(Job.status), newest_event, newest_metric).where(
        job_id.in_(job_ids)
    )
    return {
        found: Progress(JobStatus(status), event_id or 0, metric_id or 0)
        for found, status, event_id, metric_id in session.execute(query)
    }


def checkpoints_of(
    session: Session, job_id: str, after_id: int = 0, limit: int = DETAIL_ROWS
) -> Sequence[Checkpoint]:
    """A job's reported checkpoints after ``after_id``, oldest first, at most ``limit``."""
    query = (
        select(Checkpoint)
        .where(Checkpoint.job_id == job_id, col(Checkpoint.id) > after_id)
        .order_by(col(Checkpoint.id))
    )
    return session.exec(query.limit(limit)).all()


Recorded = TypeVar("Recorded", JobEvent, MetricPoint, Checkpoint)


def latest_of(session: Session, table: type[Recorded], job_id: str) -> list[Recorded]:
    """A job's newest ``DETAIL_ROWS`` events, metric points or checkpoints, oldest first."""
    query = select(table).where(table.job_id == job_id).order_by(col(table.id).desc())
    return list(reversed(session.exec(query.limit(DETAIL_ROWS)).all()))


def job_fields(job: Job) -> dict[str, Any]:
    # getattr, not model_dump: it reloads attributes that a commit expired.
    return {name: getattr(job, name) for name in Job.model_fields}


def job_record(session: Session, job: Job, team: str) -> dict[str, Any]:
    """The job as its detail shows it: its fields, team name, attempts, and its latest events,
    metric points and checkpoints (bounded however long it runs)."""
    return {
        **job_fields(job),
        "team": team,
        "attempts": attempts_of(session, job.id),
        "events": latest_of(session, JobEvent, job.id),
        "metrics": latest_of(session, MetricPoint, job.id),
        "checkpoints": latest_of(session, Checkpoint, job.id),
        "checkpoint_bytes": checkpoint_bytes(session, job.id),
    }


def kept_checkpoints(session: Session, job_id: str) -> list[Checkpoint]:
    """The job's checkpoints that retention has not deleted, oldest step first."""
    query = (
        select(Checkpoint)
        .where(Checkpoint.job_id == job_id, col(Checkpoint.deleted_at).is_(None))
        .order_by(col(Checkpoint.step), col(Checkpoint.id))
    )
    return list(session.exec(query).all())


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


def count_checkpoints(session: Session, attempt: Attempt) -> int:
    query = select(func.count()).where(
        Checkpoint.job_id == attempt.job_id, Checkpoint.attempt_id == attempt.id
    )
    return int(session.exec(query).one())


def record_checkpoint(
    session: Session,
    attempt: Attempt,
    step: int,
    path: str,
    tag: str | None,
    save_seconds: float | None = None,
) -> Checkpoint:
    """Store a saved checkpoint; the same step and path reported again is one row."""
    query = select(Checkpoint).where(
        Checkpoint.job_id == attempt.job_id,
        Checkpoint.attempt_id == attempt.id,
        Checkpoint.step == step,
        Checkpoint.path == path,
    )
    checkpoint = session.exec(query).first() or Checkpoint(
        job_id=attempt.job_id, attempt_id=attempt.id, step=step, path=path
    )
    checkpoint.tag, checkpoint.save_seconds = tag, save_seconds
    session.add(checkpoint)
    session.flush()
    return checkpoint


def checkpoint_bytes(session: Session, job_id: str) -> int:
    """The bytes of the job's checkpoints that retention has not deleted, as last measured."""
    query = select(func.coalesce(func.sum(Checkpoint.size_bytes), 0)).where(
        Checkpoint.job_id == job_id, col(Checkpoint.deleted_at).is_(None)
    )
    return int(session.exec(query).one() or 0)


def save_durations(session: Session, job_id: str) -> list[float]:
    """How long each of the job's checkpoints took to save, where its training code said."""
    query = select(Checkpoint.save_seconds).where(
        Checkpoint.job_id == job_id, col(Checkpoint.save_seconds).is_not(None)
    )
    return [float(s) for s in session.exec(query).all() if s is not None]


def _time_limit_s(spec: JobSpec) -> float | None:
    minutes = spec.resources.time_limit_minutes
    return None if minutes is None else minutes * 60.0
