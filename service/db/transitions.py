"""The one place that changes a job's or an attempt's status.

Each move is a compare-and-set (``UPDATE ... WHERE id = ? AND status = old``) plus an event row,
in the caller's transaction. When the row is no longer in an expected state, nothing is written
and ``False`` comes back: another worker or a user got there first. A job moving into or out of
a status that holds GPUs adds to or takes from its team's and cluster's ``HeldGpus`` counter in
the same transaction, so the counters always agree with the statuses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from sqlalchemy import update
from sqlmodel import Session, col

from service.core.admission import HOLDING, gpus_of
from service.core.states import (
    AttemptStatus,
    JobStatus,
    check_attempt_transition,
    check_job_transition,
)
from service.db.held_gpus import HeldChange, add_held
from service.db.models import Attempt, Job, JobEvent, utcnow
from service.db.rows import Row, new_row

Status = TypeVar("Status", JobStatus, AttemptStatus)


def move_job(
    session: Session,
    job: Job,
    expected: JobStatus | Iterable[JobStatus],
    new: JobStatus,
    reason: str,
    **fields: Any,
) -> bool:
    """Move ``job`` to ``new`` if it is still in one of ``expected``; refreshes ``job``."""
    event = JobEvent(
        job_id=job.id,
        subject="job",
        attempt_number=job.current_attempt or None,
        to_status=new,
        reason=reason,
    )
    return _compare_and_set(session, job, expected, new, check_job_transition, event, fields)


def move_attempt(
    session: Session,
    attempt: Attempt,
    expected: AttemptStatus | Iterable[AttemptStatus],
    new: AttemptStatus,
    reason: str,
    **fields: Any,
) -> bool:
    """Move ``attempt`` to ``new`` if it is still in one of ``expected``; refreshes it."""
    if new == AttemptStatus.RUNNING:
        fields.setdefault("started_at", utcnow())
    event = JobEvent(
        job_id=attempt.job_id,
        subject="attempt",
        attempt_number=attempt.number,
        to_status=new,
        reason=reason,
    )
    return _compare_and_set(
        session, attempt, expected, new, check_attempt_transition, event, fields
    )


def note_job(session: Session, job: Job, reason: str) -> None:
    """An event that moves no status: a decision about the job, in words, for its history."""
    session.add(
        JobEvent(
            job_id=job.id,
            subject="job",
            attempt_number=job.current_attempt or None,
            from_status=job.status,
            to_status=job.status,
            reason=reason[:2000],
        )
    )


def note_attempt(session: Session, attempt: Attempt, reason: str) -> None:
    """An event that moves no status: what became of the attempt, in words (a report, why
    nothing follows it)."""
    session.add(
        JobEvent(
            job_id=attempt.job_id,
            subject="attempt",
            attempt_number=attempt.number,
            from_status=attempt.status,
            to_status=attempt.status,
            reason=reason[:2000],
        )
    )


def record_created(job_id: str, reason: str) -> Row:
    """The first event of a job: it exists, PENDING (stored with the job, see ``rows``)."""
    return new_row(
        JobEvent, job_id=job_id, subject="job", to_status=JobStatus.PENDING, reason=reason
    )


def admit_on_creation(job: Row) -> tuple[Row, HeldChange]:
    """Admit a job not yet stored: it is written QUEUED, with the event a later move from
    PENDING would have written and the change to the counters that its GPUs make, both to be
    written with it (``service.db.new_job``)."""
    check_job_transition(JobStatus.PENDING, JobStatus.QUEUED)
    job["status"] = JobStatus.QUEUED
    event = new_row(
        JobEvent,
        job_id=job["id"],
        subject="job",
        attempt_number=job["current_attempt"],
        from_status=JobStatus.PENDING,
        to_status=JobStatus.QUEUED,
        reason="admitted",
    )
    return event, HeldChange(job["team_id"], job["cluster"], gpus_of(job["spec"]))


def _compare_and_set(
    session: Session,
    row: Job | Attempt,
    expected: Status | Iterable[Status],
    new: Status,
    check: Callable[[Status, Status], None],
    event: JobEvent,
    fields: dict[str, Any],
) -> bool:
    olds = [expected] if isinstance(expected, str) else sorted(set(expected))
    for old in olds:
        check(old, new)
    now = utcnow()
    if new.terminal:
        fields.setdefault("finished_at", now)
    table = type(row)
    for old in olds:  # one statement per old status, so the event records the true origin
        moved = session.execute(
            update(table)
            .where(col(table.id) == row.id, col(table.status) == old)
            .values(status=new, updated_at=now, **fields)
            # The row comes back with the update and replaces the loaded one: no refresh,
            # and no pass matching every object the session holds against the criteria.
            .returning(table)
            .execution_options(synchronize_session=False, populate_existing=True)
        ).scalar_one_or_none()
        if moved is not None:
            if moved is not row:  # ``row`` was not this session's copy
                session.refresh(row)
            event.from_status = old
            session.add(event)
            if isinstance(row, Job):
                _move_held_gpus(session, row, JobStatus(old), JobStatus(new))
            return True
    session.refresh(row)
    return False


def _move_held_gpus(session: Session, job: Job, old: JobStatus, new: JobStatus) -> None:
    """A job entering or leaving a holding status takes or releases its GPUs in the counters."""
    if (old in HOLDING) == (new in HOLDING):
        return
    gpus = gpus_of(job.spec)
    add_held(session, HeldChange(job.team_id, job.cluster, gpus if new in HOLDING else -gpus))
