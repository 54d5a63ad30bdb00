"""Relaunching after a disruption: a preempted, evicted or lost node is not the job's fault.

When the cluster took a node away (``NODE_LOST`` from a backend that still knew the run, e.g. a
Kubernetes ``DisruptionTarget``), the same plan runs again as a new attempt, resuming from the
latest checkpoint. These retries have their own small budget and do not use the escalation's
``max_attempts``: the user's attempts are for their own failures (the budgets are
``service.core.attempt_kinds``'s; the attempt itself is ``service.db.attempts.next_attempt``'s).
"""

from __future__ import annotations

from sqlmodel import Session

from service.core.attempt_kinds import AttemptKind, within_own_limit
from service.core.failures import FailureClass
from service.core.states import AttemptStatus, JobStatus
from service.db.attempts import next_attempt
from service.db.jobs import attempts_of
from service.db.models import Attempt, Job, utcnow
from service.db.transitions import move_attempt, move_job
from service.settings import Settings
from workers.backends.base import BackendState, BackendStatus

# The words each kind's rung begins with (the kind itself is the attempt's ``kind``)
DISRUPTION_RUNG = "retry after a disruption"
# A stop from outside zeropilot (a drain, the cluster's own preemption) that the training
# answered by saving: it goes on from that checkpoint, on a budget of its own.
STOP_RUNG = "resume after a stop"
PREEMPTION_RUNG = "resume after preemption"


def retry_after_disruption(
    session: Session,
    settings: Settings,
    job: Job,
    attempt: Attempt,
    failure: FailureClass,
    status: BackendStatus,
    summary: str,
) -> str | None:
    """Queue the same plan again after a disruption; the new attempt's id, or None."""
    # LOST: the backend no longer knows the run (deleted behind its back): not a disruption.
    lost_node = failure == FailureClass.NODE_LOST and status.state == BackendState.FAILED
    stopped = failure == FailureClass.PREEMPTED and status.state != BackendState.LOST
    if not (lost_node or stopped):
        return None
    kind, rung = (
        (AttemptKind.STOP, STOP_RUNG) if stopped else (AttemptKind.DISRUPTION, DISRUPTION_RUNG)
    )
    if not within_own_limit((a.kind for a in attempts_of(session, job.id)), kind):
        return None
    active = (JobStatus.LAUNCHING, JobStatus.RUNNING)
    if not move_job(session, job, active, JobStatus.ESCALATING, f"{failure}: {summary[:300]}"):
        return None
    rung = f"{rung} ({status.native_state or failure})"
    new = next_attempt(session, settings.data_dir, job, attempt, kind, rung=rung,
                       backend=attempt.backend)  # fmt: skip
    number, checkpoint = new.attempt.number, new.checkpoint
    move_job(
        session,
        job,
        JobStatus.ESCALATING,
        JobStatus.QUEUED,
        f"attempt {number} queued: the same plan again after {failure}"
        + (f", from the step-{checkpoint.step} checkpoint" if checkpoint else "")
        + " (not counted)",
        current_attempt=number,
    )
    return new.attempt.id


def requeue_preempted(
    session: Session,
    settings: Settings,
    job: Job,
    attempt: Attempt,
    summary: str,
    evidence: dict[str, object],
) -> str | None:
    """The attempt zeropilot stopped for another job has ended: the job waits again at its
    original place (admission orders by submit time), its next attempt the same plan from the
    latest checkpoint (the one it saved at the stop, if it did). Counts no attempt."""
    preemptor = job.stopping_for
    saved = " after saving" if attempt.runtime_failure_tag == FailureClass.PREEMPTED else ""
    reason = f"preempted by job {preemptor}: stopped{saved} ({summary[:300]})"
    moved = move_attempt(
        session,
        attempt,
        (AttemptStatus.LAUNCHING, AttemptStatus.RUNNING),
        AttemptStatus.PREEMPTED,
        reason,
        failure_class=FailureClass.PREEMPTED,
        failure_message=reason[:2000],
        **evidence,
    )
    if not moved:
        return None
    new = next_attempt(
        session, settings.data_dir, job, attempt, AttemptKind.PREEMPTION,
        rung=f"{PREEMPTION_RUNG} (by job {preemptor})", backend=attempt.backend,
    )  # fmt: skip
    number, checkpoint = new.attempt.number, new.checkpoint
    where = f" from the step-{checkpoint.step} checkpoint" if checkpoint else ""
    move_job(
        session,
        job,
        (JobStatus.LAUNCHING, JobStatus.RUNNING),
        JobStatus.PENDING,
        f"preempted by job {preemptor}; attempt {number} waits at the job's place{where}"
        " (not counted)",
        current_attempt=number,
        stopping_for=None,
        borrowing=False,
        preempted_by=[*job.preempted_by, preemptor],
        requeued_at=utcnow(),
        message=f"waiting: preempted by job {preemptor}; back in line at its original place",
    )
    return new.attempt.id
