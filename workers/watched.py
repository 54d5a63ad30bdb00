"""The active attempts a reconcile pass watches, read in one query, and which of them a poll's
answer leaves as they are (no session opened, nothing written)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update
from sqlmodel import col

from service.core.states import AttemptStatus, JobStatus
from service.db.models import Attempt, Job
from service.db.session import session_scope
from service.settings import Settings
from workers.backends.base import BackendState, BackendStatus

ACTIVE_ATTEMPT = (AttemptStatus.LAUNCHING, AttemptStatus.RUNNING)


@dataclass(frozen=True)
class Watched:
    attempt_id: str
    ref: str
    cluster: str
    attempt_status: str
    native_state: str
    failure_message: str
    job_status: str
    stopping_for: str | None
    stop_begun: bool = False  # zeropilot began stopping it (a grace was chosen): a hang, say


@dataclass(frozen=True)
class PollCounts:
    """What one cluster's part of a pass did: for the metrics and the overrun warning."""

    backend: str
    attempts: int
    calls: int
    seconds: float


def active_attempts(settings: Settings) -> list[Watched]:
    """Every attempt on a cluster that has not ended, with what deciding needs of its job."""
    query = (
        select(
            col(Attempt.id),
            col(Attempt.backend_ref),
            col(Job.cluster),
            col(Attempt.status),
            col(Attempt.native_state),
            col(Attempt.failure_message),
            col(Job.status),
            col(Job.stopping_for),
            col(Attempt.stop_grace_s).is_not(None),
        )
        .join(Job, col(Job.id) == Attempt.job_id)
        .where(col(Attempt.status).in_(ACTIVE_ATTEMPT), col(Attempt.backend_ref).is_not(None))
    )
    with session_scope(settings.database_url) as session:
        return [Watched(*row) for row in session.execute(query).all()]


def unchanged(watched: Watched, status: BackendStatus) -> bool:
    """Whether applying ``status`` would write nothing: still waiting for the same reason, or
    still running. A cancelled or preempted job's stop is sent again every pass."""
    if _being_stopped(watched):
        return False
    if status.state == BackendState.PENDING:
        return (watched.native_state, watched.failure_message) == (
            status.native_state,
            status.reason,
        )
    if status.state == BackendState.RUNNING:
        return (
            watched.attempt_status == AttemptStatus.RUNNING
            and watched.job_status != JobStatus.LAUNCHING
        )
    return False


def pending_note(watched: Watched, status: BackendStatus) -> dict[str, str] | None:
    """The attempt's new pending reason, when that is all applying ``status`` would write (a
    LAUNCHING attempt still waiting, of a job neither cancelled nor stopping): the pass writes
    those together, in one statement, rather than one session each."""
    if _being_stopped(watched):
        return None
    if status.state != BackendState.PENDING or watched.attempt_status != AttemptStatus.LAUNCHING:
        return None
    return {
        "id": watched.attempt_id,
        "native_state": status.native_state,
        "failure_message": status.reason,
    }


def _being_stopped(watched: Watched) -> bool:
    """Cancelled, stopping for a preemptor, or a stop zeropilot began (a hang): each pass
    sends the stop again."""
    return (
        watched.job_status == JobStatus.CANCELLED
        or bool(watched.stopping_for)
        or watched.stop_begun
    )


def write_pending_notes(settings: Settings, notes: list[dict[str, str]]) -> None:
    """Every note of a pass's cluster in one UPDATE by primary key (an executemany)."""
    if notes:
        with session_scope(settings.database_url) as session:
            session.execute(update(Attempt), notes)
