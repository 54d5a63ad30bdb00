"""Relaunching after a disruption: a preempted, evicted or lost node is not the job's fault.

When the cluster took a node away (``NODE_LOST`` from a backend that still knew the run, e.g. a
Kubernetes ``DisruptionTarget``), the same plan runs again as a new attempt, resuming from the
latest checkpoint. These retries have their own small budget and do not use the escalation's
``max_attempts``: the user's attempts are for their own failures.
"""

from __future__ import annotations

from sqlmodel import Session

from service.core.failures import FailureClass
from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.db.jobs import add_attempt, attempts_of
from service.db.models import Attempt, Checkpoint, Job, utcnow
from service.db.transitions import move_attempt, move_job
from service.settings import Settings
from workers.backends.base import BackendState, BackendStatus
from workers.retention import resume_checkpoint

MAX_DISRUPTION_RETRIES = 3  # per job: a cluster that keeps taking nodes away ends it
DISRUPTION_RUNG = "retry after a disruption"  # how these attempts are told apart
# A stop from outside zeropilot (a drain, the cluster's own preemption) that the training
# answered by saving: it goes on from that checkpoint. Its own budget, larger: nothing is lost.
MAX_STOP_RESUMES = 20
STOP_RUNG = "resume after a stop"
_DISRUPTION = (DISRUPTION_RUNG, MAX_DISRUPTION_RETRIES)
PREEMPTION_RUNG = "resume after preemption"
REPLACEMENT_RUNG = "re-placed on"  # workers.replacement: another cluster after a failed launch


def counts_against_the_user(rung: str) -> bool:
    """Whether an attempt uses one of the spec's ``escalation.max_attempts``: not when the
    cluster or zeropilot caused it (a disruption, a stop, a preemption, a re-placement)."""
    return not rung.startswith((DISRUPTION_RUNG, STOP_RUNG, PREEMPTION_RUNG, REPLACEMENT_RUNG))


def disruption_retries(session: Session, job: Job, rung: str = DISRUPTION_RUNG) -> int:
    return sum(1 for a in attempts_of(session, job.id) if a.rung.startswith(rung))


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
    rung, budget = (
        (STOP_RUNG, MAX_STOP_RESUMES) if stopped else (DISRUPTION_RUNG, MAX_DISRUPTION_RETRIES)
    )
    if disruption_retries(session, job, rung) >= budget:
        return None
    active = (JobStatus.LAUNCHING, JobStatus.RUNNING)
    if not move_job(session, job, active, JobStatus.ESCALATING, f"{failure}: {summary[:300]}"):
        return None
    new, checkpoint = same_plan_again(
        session, settings, job, attempt, f"{rung} ({status.native_state or failure})"
    )
    number = new.number
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
    return new.id


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
    new, checkpoint = same_plan_again(
        session, settings, job, attempt, f"{PREEMPTION_RUNG} (by job {preemptor})"
    )
    number = new.number
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
    return new.id


def same_plan_again(
    session: Session, settings: Settings, job: Job, attempt: Attempt, rung: str
) -> tuple[Attempt, Checkpoint | None]:
    """The next attempt: the same plan, resuming natively from the newest complete checkpoint (the
    stage and world size are unchanged, so no conversion), and that checkpoint."""
    spec = JobSpec.model_validate(job.spec)
    checkpoint = resume_checkpoint(session, settings, job) if spec.checkpoint.resume else None
    new = add_attempt(
        session,
        job,
        number=attempt.number + 1,
        plan=attempt.plan,
        rung=rung,
        backend=attempt.backend,
        resumed_from=checkpoint.path if checkpoint else None,
        resume_method="native" if checkpoint else None,
    )
    return new, checkpoint
