"""The one place that changes a job's or an attempt's status.

Each move is a compare-and-set (``UPDATE ... WHERE id = ? AND status = old``) plus an event row,
in the caller's transaction. When the row is no longer in an expected state, nothing is written
and ``False`` comes back: another worker or a user got there first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import update
from sqlmodel import Session, col

from service.core.states import (
    AttemptStatus,
    JobStatus,
    check_attempt_transition,
    check_job_transition,
)
from service.db.models import Attempt, Job, JobEvent, utcnow


def move_job(
    session: Session,
    job: Job,
    expected: JobStatus | Iterable[JobStatus],
    new: JobStatus,
    reason: str,
    **fields: Any,
) -> bool:
    """Move ``job`` to ``new`` if it is still in one of ``expected``; refreshes ``job``."""
    olds = _as_list(expected)
    for old in olds:
        check_job_transition(old, new)
    now = utcnow()
    if new.terminal:
        fields.setdefault("finished_at", now)
    for old in olds:
        result = session.execute(
            update(Job)
            .where(col(Job.id) == job.id, col(Job.status) == old)
            .values(status=new, updated_at=now, **fields)
        )
        if result.rowcount == 1:  # type: ignore[attr-defined]
            session.add(
                JobEvent(
                    job_id=job.id,
                    subject="job",
                    attempt_number=job.current_attempt or None,
                    from_status=old,
                    to_status=new,
                    reason=reason,
                )
            )
            session.refresh(job)
            return True
    session.refresh(job)
    return False


def move_attempt(
    session: Session,
    attempt: Attempt,
    expected: AttemptStatus | Iterable[AttemptStatus],
    new: AttemptStatus,
    reason: str,
    **fields: Any,
) -> bool:
    """Move ``attempt`` to ``new`` if it is still in one of ``expected``; refreshes it."""
    olds = _as_list(expected)
    for old in olds:
        check_attempt_transition(old, new)
    now = utcnow()
    if new.terminal:
        fields.setdefault("finished_at", now)
    if new == AttemptStatus.RUNNING:
        fields.setdefault("started_at", now)
    for old in olds:
        result = session.execute(
            update(Attempt)
            .where(col(Attempt.id) == attempt.id, col(Attempt.status) == old)
            .values(status=new, updated_at=now, **fields)
        )
        if result.rowcount == 1:  # type: ignore[attr-defined]
            session.add(
                JobEvent(
                    job_id=attempt.job_id,
                    subject="attempt",
                    attempt_number=attempt.number,
                    from_status=old,
                    to_status=new,
                    reason=reason,
                )
            )
            session.refresh(attempt)
            return True
    session.refresh(attempt)
    return False


def record_created(session: Session, job: Job, reason: str) -> None:
    """The first event of a job: it exists, in its initial status."""
    session.add(JobEvent(job_id=job.id, subject="job", to_status=job.status, reason=reason))


def _as_list(expected: Any) -> list[Any]:
    if isinstance(expected, str):  # both status enums are StrEnums
        return [expected]
    return sorted(set(expected))
