"""The same plan again: after a disruption or a stop from outside, and after a preemption.

``service.core.outcomes`` decides when (a node the cluster took away, a stop the training
answered by saving, a stop zeropilot made for another job) and on which budget; this carries it
out: attempt N+1 with the ended attempt's plan, from the newest complete checkpoint
(``service.db.attempts.next_attempt``), and the job's move, with the words a person reads.
"""

from __future__ import annotations

from sqlmodel import Session

from service.core.attempt_kinds import AttemptKind
from service.core.outcomes import Ending
from service.core.states import JobStatus
from service.db.attempts import next_attempt
from service.db.models import Attempt, Job, utcnow
from service.db.transitions import move_job
from service.settings import Settings

# The words each kind's rung begins with (the kind itself is the attempt's ``kind``)
RUNGS = {
    AttemptKind.DISRUPTION: "retry after a disruption",
    # a stop from outside zeropilot (a drain, the cluster's own preemption) that it saved at
    AttemptKind.STOP: "resume after a stop",
}
PREEMPTION_RUNG = "resume after preemption"
_RUNNING = (JobStatus.LAUNCHING, JobStatus.RUNNING)


def retry_same_plan(
    session: Session, settings: Settings, job: Job, attempt: Attempt, kind: AttemptKind,
    ending: Ending,
) -> str | None:  # fmt: skip
    """Queue the same plan again as an attempt of ``kind``; the new attempt's id, or None
    when the job moved on meanwhile."""
    failure = ending.failure
    reason = f"{failure}: {ending.summary[:300]}"
    if not move_job(session, job, _RUNNING, JobStatus.ESCALATING, reason):
        return None
    rung = f"{RUNGS[kind]} ({ending.native_state or failure})"
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


def requeue(
    session: Session, settings: Settings, job: Job, attempt: Attempt, preemptor: str
) -> None:
    """The attempt zeropilot stopped for another job has ended: the job waits again at its
    original place (admission orders by submit time), its next attempt the same plan from the
    latest checkpoint (the one it saved at the stop, if it did)."""
    new = next_attempt(
        session, settings.data_dir, job, attempt, AttemptKind.PREEMPTION,
        rung=f"{PREEMPTION_RUNG} (by job {preemptor})", backend=attempt.backend,
    )  # fmt: skip
    number, checkpoint = new.attempt.number, new.checkpoint
    where = f" from the step-{checkpoint.step} checkpoint" if checkpoint else ""
    move_job(
        session,
        job,
        _RUNNING,
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
