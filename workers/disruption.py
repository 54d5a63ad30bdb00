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
from service.core.states import JobStatus
from service.db.jobs import add_attempt, attempts_of
from service.db.models import Attempt, Job
from service.db.transitions import move_job
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
    spec = JobSpec.model_validate(job.spec)
    active = (JobStatus.LAUNCHING, JobStatus.RUNNING)
    if not move_job(session, job, active, JobStatus.ESCALATING, f"{failure}: {summary[:300]}"):
        return None
    checkpoint = resume_checkpoint(session, settings, job) if spec.checkpoint.resume else None
    number = attempt.number + 1
    new = add_attempt(
        session,
        job,
        number=number,
        plan=attempt.plan,
        rung=f"{rung} ({status.native_state or failure})",
        backend=attempt.backend,
        resumed_from=checkpoint.path if checkpoint else None,
        resume_method="native" if checkpoint else None,
    )
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
